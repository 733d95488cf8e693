"""The two engine loops, side by side. Each step is schedule -> execute -> update (LLMEngine's three phases);
the loops differ only in when the next step is planned. Data-parallel ranks are visited in order, each scheduling
then dispatching its step before the next rank plans (a rank's KV-tier saves land before the next one looks blocks
up); no rank's result is awaited before every rank is dispatched, so their devices run together.

- SynchronousLoop: a step's tokens reach the host before the next step is planned.
- OverlappedLoop (async scheduling): the next step is planned and launched before this one's tokens are applied,
  so the host's work runs while the device computes. Decode rows of the step planned ahead take their input token
  from the step in flight on the device (ModelRunner.launch); a request that finishes in this step has one more
  row computed, whose token is dropped, and one that finishes by length is not planned past it. When a request's
  next token depends on its last one on the host (a grammar's bitmask, output penalties), the step planned ahead
  dispatches only its model; its sampler follows as soon as this step's tokens are in the requests and their
  grammars, before this step's text and outputs are made (LLMEngine.update's sample_next). With speculative
  decoding, steps are planned ahead only while nobody proposes (a batch at or above the size that turns proposals
  off): a row's proposals follow the tokens the step before kept, so those steps run one after the other.
"""

import logging
from typing import Optional, Protocol

import jax

from jaxpaged.config import EngineConfig
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.engine.ranks import LaunchedStep
from jaxpaged.outputs import RequestOutput

logger = logging.getLogger(__name__)


class StepPhases(Protocol):
    """The engine's three phases, as the loops drive them (LLMEngine)."""

    def release_held_back(self) -> None: ...

    def dp_ranks(self) -> range: ...

    def schedule(self, dp_rank: int) -> SchedulerOutput: ...

    def execute(self, dp_rank: int, plan: SchedulerOutput, defer_sampling: bool = False) -> LaunchedStep: ...

    def in_lock_step(self) -> bool: ...

    def execute_together(self, plans: list[SchedulerOutput], defer_sampling: bool = False) -> list[LaunchedStep]: ...

    def update(self, launched: list[LaunchedStep], final_only: bool,
               sample_next: Optional[list[LaunchedStep]] = None) -> list[RequestOutput]: ...

    def may_plan_ahead(self) -> bool: ...

    def sampling_needs_last_tokens(self) -> bool: ...

    def has_unfinished_requests(self) -> bool: ...


def launch_every_rank(engine: StepPhases, defer_sampling: bool = False) -> list[LaunchedStep]:
    """Schedule then execute, rank by rank; nothing is awaited (see the module docstring). Ranks in lock step
    (runner/lock_step.py) all plan first, then run as one step."""
    if engine.in_lock_step():
        return engine.execute_together([engine.schedule(dp_rank) for dp_rank in engine.dp_ranks()], defer_sampling)
    return [engine.execute(dp_rank, engine.schedule(dp_rank), defer_sampling) for dp_rank in engine.dp_ranks()]


class SynchronousLoop:
    """schedule -> execute -> update, one step after the other."""

    def __init__(self, engine: StepPhases) -> None:
        self.engine = engine

    def step(self, final_only: bool) -> tuple[list[RequestOutput], bool]:
        """One step; (its outputs, False: nothing ran beside the device)."""
        engine = self.engine
        engine.release_held_back()
        launched = launch_every_rank(engine)
        return engine.update(launched, final_only), False


class OverlappedLoop:
    """Keeps one step in flight: each call launches the next step, then applies the one before."""

    def __init__(self, engine: StepPhases) -> None:
        self.engine = engine
        self.in_flight: Optional[list[LaunchedStep]] = None
        """Each rank's step launched ahead, whose tokens the next call applies."""

    def step(self, final_only: bool) -> tuple[list[RequestOutput], bool]:
        """One step; (its outputs, whether the next step was launched while the device still computed this one,
        so this call's host work ran beside the device's)."""
        engine = self.engine
        engine.release_held_back()
        launched = self.in_flight if self.in_flight is not None else launch_every_rank(engine)
        self.in_flight = None
        hidden = False
        sample_next = None
        if engine.may_plan_ahead():
            defer = engine.sampling_needs_last_tokens()
            self.in_flight = launch_every_rank(engine, defer_sampling=defer)
            sample_next = self.in_flight if defer else None
            hidden = all(step.sampled().is_running() for step in launched)
        outputs = engine.update(launched, final_only, sample_next)
        if not engine.has_unfinished_requests():
            self.in_flight = None  # every request it computes for has finished: its tokens would be dropped
        return outputs, hidden


def resolve_async_scheduling(config: EngineConfig, platform: str) -> bool:
    """config.async_scheduling as a bool for devices of `platform`. None is on unless the KV tiers or multi-host
    serving are on (whose transfers and follower broadcasts expect each step's tokens on the host before the next
    is planned). On the CPU too: there the "device" is the host's own cores, so the host work planned ahead shares
    them with XLA's threads, yet W1 gained there (docs/performance.md). True with the tiers or multi-host is a
    ValueError. `platform` names the devices in the log line."""
    unsupported = config.cache.kv_offload_enabled or jax.process_count() > 1
    if config.async_scheduling is None:
        if unsupported:
            logger.info("async scheduling off on %s: not supported with the KV tiers or multi-host serving",
                        platform)
        return not unsupported
    if config.async_scheduling and unsupported:
        raise ValueError("async_scheduling: not supported with the KV tiers (kv_offload_*) or multi-host serving; "
                         "turn one of them off")
    return config.async_scheduling
