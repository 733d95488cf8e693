"""RunningRows: each step's rows of the running requests, in admission order: prefill chunks, decodes, decodes whose
token is still in flight (async scheduling) and speculative rows (a decode plus the proposals it verifies). When a
row's tokens find no free blocks, a running request is preempted (preemption.py) until they do.

NOTE: decodes are never starved: running requests keep their admission order, a prefill chunk is capped by the
budget only when nothing was admitted behind it, so what the requests up to any decode ask for never exceeds what
they got the step before.
"""

from typing import Optional

from .kv_cache_manager import KVCacheManager
from .preemption import Preemption
from .request import Request
from .scheduler_output import ScheduledRequest
from .spec_verification import num_verifiable
from .stop_criteria import reaches_length_limit


class RunningRows:
    """Plans the running requests' rows of a step."""

    def __init__(self, kv_cache_manager: KVCacheManager, preemption: Preemption, max_num_batched_tokens: int,
                 max_num_seqs: int, max_model_len: int, long_prefill_token_threshold: int,
                 max_spec_tokens_per_step: int) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.preemption = preemption
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.long_prefill_token_threshold = long_prefill_token_threshold
        """Most tokens of one prefill chunk (0: no cap beyond the budget)."""
        self.max_spec_tokens_per_step = max_spec_tokens_per_step
        """Most proposals one step verifies (0: speculative decoding off)."""

    def schedule(self, running: list[Request], scheduled: list[ScheduledRequest],
                 preempted_request_ids: set[str]) -> tuple[int, int]:
        """Schedule running requests in admission order, preempting when blocks run out; the budget left and the
        number of proposals scheduled (each samples one of the step's max_num_seqs rows)."""
        budget = self.max_num_batched_tokens
        block_size = self.kv_cache_manager.block_size
        get_block_ids = self.kv_cache_manager.get_block_ids
        max_model_len = self.max_model_len
        # A proposal's row is a sampling row like a sequence's: rows for every running request stay free.
        spec_limit = spec_budget = min(self.max_spec_tokens_per_step, self.max_num_seqs - len(running))
        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            start = request.num_computed_tokens
            num_new_tokens = self._num_new_tokens(request, budget)
            if num_new_tokens == 0:
                index += 1
                continue
            num_spec = 0
            if request.spec_token_ids and num_new_tokens == 1 and not request.num_pending_tokens:
                num_spec = min(num_verifiable(request, budget, max_model_len), spec_budget)
                spec_budget -= num_spec
                num_new_tokens += num_spec
            # Most decodes write into room left in their last block (its earlier slot is computed, so it is
            # held): only a chunk, or a token that opens a new block, needs allocating.
            if num_new_tokens != 1 or start % block_size == 0:
                new_index, num_returned = self._allocate_or_preempt(running, index, num_new_tokens, scheduled,
                                                                    preempted_request_ids)
                budget += num_returned
                if new_index is None:
                    break  # the request preempted itself: nothing behind it would get blocks either
                index = new_index
            # NOTE: the row is built here, not in a helper: this loop runs for every decode, every step.
            tokens = request.all_token_ids
            num_known, num_pending = len(tokens), request.num_pending_tokens
            end = start + num_new_tokens
            if num_pending:  # a one-token step whose token is still on the device: a placeholder stands in
                scheduled.append(ScheduledRequest(request, [0], start, get_block_ids(request.request_id), True,
                                                  input_in_flight=True))
            elif num_spec:  # the newest token and the proposals after it, verified by sampling at each
                scheduled.append(ScheduledRequest(request, [tokens[start], *request.spec_token_ids[:num_spec]],
                                                  start, get_block_ids(request.request_id), True,
                                                  num_spec_tokens=num_spec))
            else:
                scheduled.append(ScheduledRequest(request, tokens[start:end], start,
                                                  get_block_ids(request.request_id), end == num_known))
            if end - num_spec == num_known + num_pending:
                request.num_pending_tokens = num_pending + 1
            request.num_computed_tokens = end
            budget -= num_new_tokens
            index += 1
        return budget, spec_limit - spec_budget

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        """Tokens the request's row computes this step (a chunk capped by the threshold and the budget); 0 when it
        has nothing to compute."""
        # Async scheduling plans a step while the one before is in flight: its sampled token is known to come
        # (num_pending_tokens), not what it is; this step computes it all the same, fed on the device.
        num_pending = request.num_pending_tokens
        num_new_tokens = len(request.all_token_ids) + num_pending - request.num_computed_tokens
        if num_new_tokens > 1:  # a prefill chunk (plain ifs: this runs for every decode, every step)
            threshold = self.long_prefill_token_threshold
            if threshold and num_new_tokens > threshold:
                num_new_tokens = threshold
            return min(num_new_tokens, budget)
        if num_new_tokens <= 0 or (num_pending and reaches_length_limit(request, self.max_model_len, num_pending)):
            # Nothing to compute until update_from_output() appends its sampled token, or the token in flight
            # ends the request by length (nothing is planned past it).
            return 0
        return num_new_tokens

    def _allocate_or_preempt(self, running: list[Request], index: int, num_new_tokens: int,
                             scheduled: list[ScheduledRequest], preempted_request_ids: set[str]
                             ) -> tuple[Optional[int], int]:
        """Allocate running[index]'s slots, preempting requests until they fit: (the request's index after the
        preemptions, or None when it preempted itself; the budget the preempted rows gave back)."""
        request = running[index]
        allocate_slots = self.kv_cache_manager.allocate_slots
        preemption = self.preemption
        num_returned = 0
        while allocate_slots(request, num_new_tokens) is None:
            victim_index = preemption.select_victim_index(running)
            victim = running[victim_index]
            num_returned += preemption.preempt(running, victim_index, index, scheduled, preempted_request_ids)
            if victim is request:
                return None, num_returned
            if victim_index < index:
                index -= 1
        return index, num_returned
