"""Process 0's side of a multi-process job: publish every step's plan, keep idle followers checked, bound waits.

How a lost follower is noticed (the documented bound):
  - it died: the next collective fails at once (its TCP connection resets), and the engine step raises;
  - it hangs: the guarded step or heartbeat exceeds `timeout_s` and the watchdog fires;
  - while process 0 is idle it sends a heartbeat plan every `timeout_s / 3`, so an idle job notices too.
So process 0 learns of the loss within timeout_s + timeout_s / 3 of it. The server then fails the requests in
flight, answers 503 on /health for a short drain, and exits with EXIT_FOLLOWER_LOST (see server/launcher.py).
"""

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from jaxpaged.multihost.runtime import EXIT_FOLLOWER_LOST
from jaxpaged.multihost.step_plan import PlanKind, StepPlan, StepPlanChannel
from jaxpaged.multihost.watchdog import CollectiveWatchdog
from jaxpaged.runner.batch import StepInputs
from jaxpaged.runner.buckets import Bucket

logger = logging.getLogger(__name__)


def follower_lost(what: str) -> None:
    """Ends process 0 at once (the default for engines outside the server: never hang on a lost follower)."""
    logger.critical("a follower process stopped answering (%s); exiting with code %d", what, EXIT_FOLLOWER_LOST)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FOLLOWER_LOST)  # not sys.exit: jax.distributed's shutdown barrier would wait for the lost process


class FollowerLink:
    """The leader's view of its followers: the plan channel plus a deadline on every wait for them."""

    def __init__(self, buckets: Sequence[Bucket], empty_inputs: Callable[[Bucket], StepInputs], timeout_s: float,
                 on_lost: Callable[[str], None] = follower_lost) -> None:
        """`empty_inputs`: the runner's padding batch of a bucket (StepInputBuilder.empty: every KV cache group's
        tables), the shape of each step's broadcast."""
        self.channel = StepPlanChannel(buckets, empty_inputs)
        self.watchdog = CollectiveWatchdog(timeout_s, on_lost)
        self.heartbeat_interval_s = timeout_s / 3
        self._last_publish = time.monotonic()
        self._closed = False

    def set_on_lost(self, on_lost: Callable[[str], None]) -> None:
        """What to do when a follower stops answering (called from the watchdog thread, once)."""
        self.watchdog.on_expire = on_lost

    def guard(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Bounds a stretch of work that waits on the followers (an engine step)."""
        return self.watchdog.guard(what)

    def warm_up(self) -> None:
        with self.guard("the followers' warm-up"):
            self.channel.warm_up()
        self._last_publish = time.monotonic()

    def publish_step(self, rank: int, bucket: Bucket, inputs: StepInputs) -> None:
        """Sends a step's plan; the caller then runs the same step (inside its own guard)."""
        self.channel.publish(StepPlan(PlanKind.STEP, rank, bucket, inputs))
        self._last_publish = time.monotonic()

    def publish_copies(self, rank: int, pairs: np.ndarray) -> None:
        """Sends a batch of block copies (before the step that reads them); the caller then applies it too."""
        self.channel.publish(StepPlan(PlanKind.COPY_BLOCKS, rank, copies=pairs))
        self._last_publish = time.monotonic()

    @property
    def closed(self) -> bool:
        """Whether the followers were told to exit (no plan can reach them any more)."""
        return self._closed

    def end_batch(self) -> None:
        """Process 0's LLM.generate call is over: the followers' call returns too (multihost/batch.py)."""
        with self.guard("ending a batch on the followers"):
            self.channel.publish(StepPlan(PlanKind.BATCH_DONE))
        self._last_publish = time.monotonic()

    def heartbeat_if_due(self) -> None:
        """Idle: a heartbeat plan when none went out for heartbeat_interval_s."""
        if self._closed or time.monotonic() - self._last_publish < self.heartbeat_interval_s:
            return
        with self.guard("a heartbeat to the followers"):
            self.channel.publish(StepPlan(PlanKind.HEARTBEAT))
        self._last_publish = time.monotonic()

    def shutdown_followers(self) -> None:
        """Tells every follower to exit 0 (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        with self.guard("telling the followers to exit"):
            self.channel.publish(StepPlan(PlanKind.SHUTDOWN))
