"""Draft-model proposals (speculative_method "draft_model"): a smaller model with the target's tokenizer proposes
its greedy continuation, k tokens per request, for every proposing request in one batched run.

The draft keeps its own paged KV (its own pool, runner/draft_runner.py) and, per request, the tokens whose K/V that
pool holds. Before proposing, the draft catches up on what it has not seen: the first time the whole prompt (and
any output), chunked within the draft step's token budget; later the tokens the target accepted and its bonus token.
Catching up yields the first proposal; k - 1 single-token steps give the rest. The K/V of proposals the target
rejected is simply overwritten by the next catch-up: rolling back is cutting the held tokens to the longest prefix
they share with the request's (which also keeps the draft right if its tokens ever disagree with the request's).

Host-only: the device work goes through a DraftSteps (runner/draft_runner.py's DraftRunner).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, Protocol

from jaxpaged.core.block_pool import BlockPool
from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import ScheduledRequest
from jaxpaged.speculative.proposal import ProposalBatch


class DraftSteps(Protocol):
    """The draft model's step: argmax ids of the sampling items of one ragged batch."""

    def greedy(self, scheduled: Sequence[ScheduledRequest]) -> list[int]:
        """One step over `scheduled`; the argmax id of each item that samples, in order."""
        ...

    def warmup(self) -> float:
        """Compile every step shape; the seconds it took."""
        ...


@dataclasses.dataclass(eq=False)
class DraftSequence:
    """What the draft's pool holds for one request."""

    request: Request
    """The request it follows (a new request under a reused id starts a new sequence)."""
    token_ids: list[int]
    """The tokens whose K/V the draft holds, at positions 0.. len - 1."""
    block_ids: list[int]
    """The draft pool's blocks, in position order; grown in place (the runner's block table mirrors the list)."""
    num_confirmed: int = 0
    """Leading token_ids known to be the request's own (its tokens are append-only): only the rest is compared."""


@dataclasses.dataclass
class _Round:
    """One request's share of a propose call."""

    sequence: DraftSequence
    num_proposals: int
    proposals: list[int] = dataclasses.field(default_factory=list)


class DraftModelProposer:
    """Proposes by running the draft model greedily (vLLM's "draft_model" method)."""

    def __init__(self, steps: DraftSteps, num_kv_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int) -> None:
        self.steps = steps
        self.pool = BlockPool(num_kv_blocks, enable_caching=False)
        """The draft pool's blocks (no prefix caching: the draft's K/V is never shared)."""
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.sequences: dict[str, DraftSequence] = {}
        """Request id -> what the draft holds for it."""

    def warmup(self) -> float:
        """Compile the draft's steps."""
        return self.steps.warmup()

    def retain(self, running: Sequence[Request]) -> None:
        """Free the draft blocks of every request that is no longer running (finished, aborted, preempted)."""
        live = {request.request_id: request for request in running}
        for request_id in [rid for rid, seq in self.sequences.items() if live.get(rid) is not seq.request]:
            self._drop(request_id)

    def propose(self, batch: ProposalBatch) -> list[tuple[list[int], Any]]:
        """Per request: its draft's greedy continuation, up to its max_tokens (none past max_tokens or
        max_model_len, nor when the draft pool has no room); the state is unused (the proposer keeps its own)."""
        rounds: list[Optional[_Round]] = []
        in_batch = {request.request_id for request in batch.requests}
        for request, max_tokens in zip(batch.requests, batch.max_tokens):
            num_tokens = len(request.all_token_ids)
            # Proposals the verification could never keep are not computed (core/spec_verification.py's caps).
            count = min(max_tokens, request.max_tokens - len(request.output_token_ids) - 1,
                        self.max_model_len - num_tokens - 1)
            sequence = self._sequence(request, num_tokens + count - 1, in_batch) if count > 0 else None
            rounds.append(None if sequence is None else _Round(sequence, count))
        active = [r for r in rounds if r is not None]
        self._catch_up(active)
        for _ in range(max((r.num_proposals for r in active), default=1) - 1):
            self._extend([r for r in active if len(r.proposals) < r.num_proposals])
        return [([] if r is None else r.proposals, None) for r in rounds]

    def _sequence(self, request: Request, num_positions: int, in_batch: set[str]) -> Optional[DraftSequence]:
        """The request's draft sequence, rolled back to what it shares with the request (its newest token always
        left to feed) and with blocks for num_positions positions; None when the pool has no room for them."""
        sequence = self.sequences.get(request.request_id)
        if sequence is None or sequence.request is not request:
            if sequence is not None:
                self._drop(request.request_id)
            sequence = self.sequences[request.request_id] = DraftSequence(request, [], [])
        tokens, held = request.all_token_ids, sequence.token_ids
        shared = sequence.num_confirmed
        limit = min(len(held), len(tokens) - 1)
        while shared < limit and held[shared] == tokens[shared]:
            shared += 1
        del held[shared:]
        sequence.num_confirmed = shared
        needed = -(-num_positions // self.block_size) - len(sequence.block_ids)
        if needed > 0:
            if needed > self.pool.num_free_blocks:  # make room from requests that do not propose now
                for request_id in [rid for rid in self.sequences if rid not in in_batch]:
                    self._drop(request_id)
            if needed > self.pool.num_free_blocks:
                return None
            sequence.block_ids += [block.block_id for block in self.pool.get_new_blocks(needed)]
        return sequence

    def _catch_up(self, rounds: list[_Round]) -> None:
        """Feed each sequence the request's tokens it has not seen, in steps within the token budget and the
        sequence limit; the step that feeds a request's newest token gives its first proposal."""
        pending = list(rounds)
        while pending:
            scheduled, sampling, budget = [], [], self.max_num_batched_tokens
            for item in pending[:self.max_num_seqs]:
                if budget == 0:
                    break
                sequence = item.sequence
                tokens = sequence.request.all_token_ids
                start = len(sequence.token_ids)
                chunk = list(tokens[start:start + budget])
                budget -= len(chunk)
                reaches_end = start + len(chunk) == len(tokens)
                scheduled.append(ScheduledRequest(sequence.request, chunk, start, sequence.block_ids,
                                                  sample=reaches_end))
                sequence.token_ids += chunk
                if reaches_end:
                    sampling.append(item)
            for item, token_id in zip(sampling, self.steps.greedy(scheduled), strict=True):
                item.proposals.append(token_id)
            pending = [item for item in pending if not item.proposals]

    def _extend(self, rounds: list[_Round]) -> None:
        """One more proposal for each round: its last proposal fed, one token each, max_num_seqs at a time."""
        for first in range(0, len(rounds), self.max_num_seqs):
            group = rounds[first:first + self.max_num_seqs]
            scheduled = []
            for item in group:
                sequence = item.sequence
                scheduled.append(ScheduledRequest(sequence.request, [item.proposals[-1]], len(sequence.token_ids),
                                                  sequence.block_ids, sample=True))
                sequence.token_ids.append(item.proposals[-1])
            for item, token_id in zip(group, self.steps.greedy(scheduled), strict=True):
                item.proposals.append(token_id)

    def _drop(self, request_id: str) -> None:
        sequence = self.sequences.pop(request_id)
        self.pool.free_blocks(self.pool.blocks[block_id] for block_id in sequence.block_ids)
