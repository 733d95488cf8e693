"""StepTimings and StepObserver: what the engine reports about each step to whoever watches (the bench's step
probe), without anyone replacing its methods."""

import dataclasses
from typing import Protocol

from jaxpaged.core.scheduler import Scheduler
from jaxpaged.outputs import RequestOutput


@dataclasses.dataclass
class StepTimings:
    """Host time of one engine step by phase, in seconds, summed over the data-parallel ranks (and, with async
    scheduling, over both steps a call plans: the one it applies and the one it launches ahead)."""

    schedule_s: float = 0.0
    """Scheduler.schedule."""
    prepare_s: float = 0.0
    """ModelRunner.prepare: padding the step's inputs into their bucket."""
    launch_s: float = 0.0
    """The rest of ModelRunner.launch: the inputs' transfer, the step's dispatch and the sampler's (its batch too)."""
    device_wait_s: float = 0.0
    """Waiting for the device to finish the step and the sampler: not host work."""
    readback_s: float = 0.0
    """Pulling the sampled ids (and logprobs) to the host once the device is done."""
    scheduler_update_s: float = 0.0
    """Scheduler.update_from_output (part of process_s)."""
    process_s: float = 0.0
    """The update phase: scheduler state, stops, detokenization, logprobs, outputs."""
    step_s: float = 0.0
    """The whole LLMEngine.step call."""
    hidden: bool = False
    """Async scheduling: the next step was launched while the device still computed this one, so this call's host
    work ran beside the device's."""

    @property
    def host_s(self) -> float:
        """The step's host work: every phase but the device wait (scheduler_update_s is part of process_s)."""
        return self.schedule_s + self.prepare_s + self.launch_s + self.readback_s + self.process_s

    def reset(self) -> None:
        """Zero every phase for the next step (the object is reused: the engine fills it in place)."""
        self.schedule_s = self.prepare_s = self.launch_s = self.device_wait_s = self.readback_s = 0.0
        self.scheduler_update_s = self.process_s = self.step_s = 0.0
        self.hidden = False


class StepObserver(Protocol):
    """Watches an engine's steps (LLMEngine.observers)."""

    def after_schedule(self, scheduler: Scheduler) -> None:
        """A rank's scheduler just planned a step (its allocations are in, nothing freed yet)."""
        ...

    def after_step(self, outputs: list[RequestOutput], timings: StepTimings) -> None:
        """An engine step returned `outputs`; `timings` is its host time."""
        ...
