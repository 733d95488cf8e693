"""Speculator: after each step, who proposes how many tokens (the adaptive part of speculative decoding).

Each request's acceptance rate is tracked (an exponential average of accepted / proposed per verified row). If the
proposals are accepted independently with probability a, the i-th is accepted with probability a^i; a proposal
is worth a verification row while that is at least MIN_POSITION_ACCEPTANCE, so a request that keeps being rejected
proposes fewer tokens, down to none (then one now and then, to notice when its output starts copying again). While
speculative_disable_by_batch_size requests or more run or wait nobody proposes: the step is then big enough that
extra rows cost about what they return. Requests with a grammar never propose (their bitmask would have to follow
each proposal): they decode as without speculation. Whoever proposes after an update is asked in one batched call
(proposal.py), so a proposer that runs a model (a draft) runs it once for all of them. A proposer with a cost of its
own (a draft model) also answers to a StepCostMeter (step_cost.py): at a batch size where steps with proposals
measure slower per emitted token than steps without, nobody proposes.
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Optional

from jaxpaged.config import SpeculativeConfig
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.speculative.proposal import ProposalBatch, Proposer
from jaxpaged.speculative.step_cost import StepCostMeter

INITIAL_ACCEPTANCE = 0.7
"""A new request's acceptance estimate: optimistic, so it proposes its full count until measured."""
ACCEPTANCE_SMOOTHING = 0.5
"""Weight of the newest verified row in the average (a request's output changes character quickly)."""
MIN_POSITION_ACCEPTANCE = 0.1
"""The i-th proposal is made while acceptance^i is at least this."""
PROBE_EVERY = 8
"""A request whose estimate allows no proposal still proposes one token every this many steps."""


@dataclasses.dataclass(slots=True)
class RequestSpeculation:
    """One request's speculation state (Request.speculation)."""

    acceptance: float = INITIAL_ACCEPTANCE
    num_proposed: int = 0
    """Tokens proposed after the last update (their verification, if it ran, is read at the next)."""
    steps_without_proposal: int = 0
    proposer_state: Any = None


class Speculator:
    """Sets Request.spec_token_ids on a scheduler's decoding requests after each update."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, meter: Optional[StepCostMeter] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """`meter`: times each step and keeps proposals to the batch sizes where they pay (None: acceptance and
        batch size decide alone, right for a proposer that costs next to nothing, like n-gram lookup)."""
        self.config = config
        self.proposer = proposer
        self.meter = meter
        self._clock = clock
        self._last_step: Optional[tuple[int, bool, float, dict[str, int]]] = None
        """(batch size, whether anyone proposed, when, output lengths) at the previous update, for the meter."""

    def warmup(self) -> float:
        """Compile what the proposer runs (a draft model's steps); the seconds it took."""
        return self.proposer.warmup()

    def proposes_at(self, scheduler: Scheduler) -> bool:
        """Whether the scheduler's batch is small enough for proposals. While it is, the engine plans no step
        ahead: proposals follow the tokens the step before kept, and a request whose token is still in flight
        gets none."""
        return 0 < len(scheduler.running) and self._below_disable_size(scheduler) and self._pays(scheduler)

    def after_update(self, scheduler: Scheduler) -> None:
        """Read the outcome of the last proposals, then propose for the next step (requests with a token still in
        flight excepted)."""
        running = scheduler.running
        now = self._clock()
        self._record_last_step(running, now)
        self.proposer.retain(running)
        propose = self._below_disable_size(scheduler) and self._pays(scheduler)
        batch = ProposalBatch([], [], [])
        # The sampling rows the scheduler can give proposals next step, handed out in its order (running first):
        # a proposal it could not verify would be computed for nothing (a draft model's steps cost).
        rows_left = min(self.config.max_tokens_per_step, scheduler.max_num_seqs - len(running))
        for request in running:
            state = request.speculation
            if state is None:
                state = request.speculation = RequestSpeculation()
            if state.num_proposed:
                if not request.spec_token_ids:  # verified: the scheduler consumed them
                    accepted = (request.num_step_tokens - 1) / state.num_proposed
                    state.acceptance += ACCEPTANCE_SMOOTHING * (min(accepted, 1.0) - state.acceptance)
                state.num_proposed = 0
            # Every running request's proposals are set anew after every update: none outlives the tokens it
            # was proposed after (a request still prefilling gets none; the scheduler verifies only decodes).
            request.spec_token_ids = []
            if not propose or request.grammar is not None or request.num_computed_tokens != request.num_tokens - 1:
                continue
            num_tokens = min(self._num_to_propose(state), rows_left)
            if num_tokens:
                rows_left -= num_tokens
                batch.requests.append(request)
                batch.max_tokens.append(num_tokens)
                batch.states.append(state.proposer_state)
        if self.meter is not None:
            self._last_step = (len(running), bool(batch.requests), now,
                               {request.request_id: len(request.output_token_ids) for request in running})
        if not batch.requests:
            return
        for request, (proposals, proposer_state) in zip(batch.requests, self.proposer.propose(batch)):
            state = request.speculation
            assert state is not None
            state.proposer_state = proposer_state
            request.spec_token_ids = proposals
            state.num_proposed = len(proposals)

    def _pays(self, scheduler: Scheduler) -> bool:
        """The meter's choice at this batch size (always yes without a meter)."""
        return self.meter is None or self.meter.should_propose(len(scheduler.running))

    def _record_last_step(self, running: list, now: float) -> None:
        """Tell the meter what the step since the previous update cost: its seconds (proposing included) and the
        tokens the requests running through it emitted (a request that finished in it is not counted: both modes
        lose those alike)."""
        if self.meter is None or self._last_step is None:
            return
        batch_size, proposed, started, output_lengths = self._last_step
        emitted = sum(len(request.output_token_ids) - output_lengths[request.request_id] for request in running
                      if request.request_id in output_lengths)
        self.meter.record(batch_size, proposed, now - started, emitted)

    def _below_disable_size(self, scheduler: Scheduler) -> bool:
        """Fewer requests than speculative_disable_by_batch_size running or waiting (vLLM counts the enqueued ones): a
        waiting request will join the batch, and the step's compute is better spent admitting it (a draft model's
        catch-up on a prompt costs a good part of the target's prefill)."""
        return len(scheduler.running) + len(scheduler.waiting) < self.config.speculative_disable_by_batch_size

    def _num_to_propose(self, state: RequestSpeculation) -> int:
        count, chance = 0, 1.0
        while count < self.config.num_speculative_tokens:
            chance *= state.acceptance
            if chance < MIN_POSITION_ACCEPTANCE:
                break
            count += 1
        if count:
            state.steps_without_proposal = 0
            return count
        state.steps_without_proposal += 1
        if state.steps_without_proposal >= PROBE_EVERY:
            state.steps_without_proposal = 0
            return 1
        return 0
