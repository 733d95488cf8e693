"""Verifying a speculative row on the host: how many proposals a step may check, and which of them it keeps.

A decoding request with proposals runs as one row of its newest token and the proposals; the step samples at every
position. Position i's draw follows the newest token and proposals[:i], so the proposals up to the first that differs
from its draw are accepted, then that draw (or, all accepted, the last one) follows. For a proposer whose proposal is
a single token, accepting exactly when the target's own draw equals it is the rejection-sampling rule: greedy output
equals non-speculative greedy output and a sampled one keeps the target's distribution. The scheduler rolls the
rejected proposals' slots and blocks back (Scheduler._apply_verified_row); this module is the request-side part.
"""

from .request import Request
from .stop_criteria import check_stop


def num_verifiable(request: Request, budget: int, max_model_len: int) -> int:
    """How many of a decoding request's proposals its step verifies: what the budget leaves beside its own token,
    and no more than could be accepted before max_tokens or max_model_len (a step appends at most one token past
    its accepted proposals)."""
    return max(0, min(len(request.spec_token_ids), budget - 1,
                      request.max_tokens - len(request.output_token_ids) - 1,
                      max_model_len - len(request.all_token_ids) - 1))


def append_verified_tokens(request: Request, proposals: list[int], sampled: list[int],
                           max_model_len: int) -> tuple[int, bool]:
    """Append the accepted proposals and the draw after them, stopping at a stop criterion among them; set the
    request's step count and computed count. Returns (proposals accepted, whether the request finished)."""
    num_accepted = 0
    while num_accepted < len(proposals) and sampled[num_accepted] == proposals[num_accepted]:
        num_accepted += 1
    request.num_pending_tokens -= 1
    request.spec_token_ids = []  # consumed (the engine's proposer reads this as "verified")
    finished = False
    num_appended = 0
    for token_id in sampled[:num_accepted + 1]:
        request.append_output_token(token_id)
        num_appended += 1
        if check_stop(request, max_model_len):  # EOS, a stop id or a length limit among the accepted
            finished = True
            break
    request.num_step_tokens = num_appended
    # K/V was computed for the newest token and the accepted proposals, so for every token but the last appended
    # (whose slot holds K/V too when a stop among the accepted ended the row: counted as not computed, as without
    # speculation).
    request.num_computed_tokens = len(request.all_token_ids) - 1
    return num_accepted, finished
