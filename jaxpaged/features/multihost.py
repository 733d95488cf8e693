"""Multi-host serving as an engine feature, on process 0: every step's plan and block copies are broadcast to
the follower processes before process 0 runs them, every wait on the followers has a deadline, idle time sends
heartbeats, and shutdown tells the followers to exit (the followers' side: jaxpaged/multihost/follower.py)."""

import contextlib
import functools
from collections.abc import Sequence
from typing import Optional

from jaxpaged.engine.ranks import DataParallelRanks
from jaxpaged.features.base import EngineFeature
from jaxpaged.multihost.leader import FollowerLink
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.sampling.token_sampler import PendingSample


class MultiHostFeature(EngineFeature):
    """Process 0's link to its followers, hooked into every rank's runner and the engine loop."""

    def __init__(self, runners: Sequence[ModelRunner], timeout_s: float) -> None:
        runner = runners[0]
        self.followers = FollowerLink(runner.ladder.buckets(), runner.inputs.empty, timeout_s)
        for rank, each in enumerate(runners):
            each.before_step = functools.partial(self.followers.publish_step, rank)
            each.before_copy = functools.partial(self.followers.publish_copies, rank)

    def after_warmup(self, ranks: DataParallelRanks) -> None:
        self.followers.warm_up()  # the followers warm up in the same order (multihost/follower.py)

    def step_guard(self) -> contextlib.AbstractContextManager[None]:
        return self.followers.guard("an engine step")

    def after_launch(self, pending: PendingSample) -> None:
        # Every process must issue its collectives in the same order, and the followers finish a rank's step
        # before they join the next plan's broadcast; so does process 0.
        pending.wait()

    def on_idle(self) -> None:
        self.followers.heartbeat_if_due()

    def close(self, ranks: DataParallelRanks, deadline: Optional[float] = None) -> None:
        self.followers.shutdown_followers()
