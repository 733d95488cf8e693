"""DataParallelRanks: the engine's data-parallel ranks, a scheduler and a model runner each (one unless
data_parallel_size > 1), and where a new request goes among them.

"Rank" alone in the engine means a data-parallel rank (`dp_rank`); a multi-host process is a process index
(jax.process_index()), and a logprob's rank is a token's place in the sorted distribution.
"""

import dataclasses
from collections.abc import Sequence
from typing import Optional

from jaxpaged.core.request import Request
from jaxpaged.core.router import PrefixAwareRouter
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.runner import ForwardedStep, LockStepRanks, ModelRunner
from jaxpaged.sampling.token_sampler import PendingSample


@dataclasses.dataclass
class LaunchedStep:
    """One rank's step, dispatched to its devices; its sampled tokens come back through `pending`."""

    dp_rank: int
    """The data-parallel rank: an index into DataParallelRanks.schedulers and .runners."""
    output: SchedulerOutput
    pending: Optional[PendingSample]
    """None while the sampler waits to be dispatched (`forwarded`: LLMEngine.sample_deferred)."""
    forwarded: Optional[ForwardedStep] = None
    """The model's half of the step, whose sampler is deferred until the step before has applied its tokens."""

    def sampled(self) -> PendingSample:
        """The dispatched sampler's pending result."""
        assert self.pending is not None, "the step's sampler was never dispatched"
        return self.pending


class DataParallelRanks:
    """One scheduler per runner; each rank has its own device group and KV pool (tensor parallelism splits a
    runner over its group). Requests route by prefix-cache hit, then load (core/router.py)."""

    def __init__(self, schedulers: Sequence[Scheduler], runners: Sequence[ModelRunner], block_size: int,
                 lock_step: Optional[LockStepRanks] = None) -> None:
        self.schedulers = list(schedulers)
        self.runners = list(runners)
        self.lock_step = lock_step
        """The ranks' shared device side when they step together (experts over dp x tp devices); None: each rank
        steps on its own."""
        self._router = PrefixAwareRouter(len(self.runners), block_size)

    def __len__(self) -> int:
        return len(self.runners)

    def route(self, request: Request) -> int:
        """The rank with the longest prefix hit for the request, then the least loaded."""
        loads = [scheduler.num_running + scheduler.num_waiting for scheduler in self.schedulers]
        return self._router.route(
            request, lambda dp_rank, r: self.schedulers[dp_rank].kv_cache_manager.find_prefix_hit(r).num_tokens, loads)

    def has_unfinished_requests(self) -> bool:
        """Some rank's scheduler still holds a request."""
        return any(scheduler.has_unfinished_requests() for scheduler in self.schedulers)
