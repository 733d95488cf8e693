"""A follower process: same model, same meshes, same compiled steps as process 0; it runs whatever plan
process 0 broadcasts and nothing else. It never tokenizes, schedules, samples or listens on a port.

Serving (run_follower) it exits 0 on process 0's SHUTDOWN plan. The batch API (multihost/batch.py) runs the
plans of one LLM.generate call at a time, up to process 0's BATCH_DONE. Either way a follower gives up on the
job (EXIT_LEADER_LOST) when process 0 is gone: a collective that fails (the connection dropped) or no plan for
2 * timeout_s while process 0 is busy (an idle serving process 0 sends a heartbeat every timeout_s / 3).
"""

import logging
import os
from collections.abc import Container
from typing import Optional

import jax

from jaxpaged.config import EngineConfig
from jaxpaged.multihost.runtime import EXIT_LEADER_LOST
from jaxpaged.multihost.step_plan import PlanKind, StepPlan, StepPlanChannel
from jaxpaged.multihost.watchdog import CollectiveWatchdog
from jaxpaged.runner.model_runner import build_rank_runners
from jaxpaged.weights.loader import LoadedModel

logger = logging.getLogger(__name__)


def leader_lost(what: str) -> None:
    """Ends this process at once: jax.distributed's shutdown barrier would wait for the lost process 0."""
    logger.critical("process %d: process 0 stopped answering (%s); exiting", jax.process_index(), what)
    os._exit(EXIT_LEADER_LOST)


class Follower:
    """Process 0's shadow: warms up exactly as process 0 does (in the constructor), then runs its plans."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.timeout_s = config.multihost.distributed_timeout
        self.runners = build_rank_runners(loaded, config)
        for runner in self.runners:
            runner.warmup(sampler=False)
        self.channel = StepPlanChannel(self.runners[0].ladder.buckets(), self.runners[0].inputs.empty)
        self.watchdog = CollectiveWatchdog(self.timeout_s, leader_lost)
        with self.watchdog.guard("process 0's warm-up", timeout_s=max(300.0, self.timeout_s)):  # + its sampler
            self.channel.warm_up()
        self.num_steps = 0

    def run_until(self, stops: Container[PlanKind], first_wait_s: Optional[float]) -> PlanKind:
        """Runs process 0's plans until one of kind `stops` arrives, and returns that kind. The wait for the first
        plan is bounded by `first_wait_s` (None: no bound, for process 0 is doing work of its own), each later one
        by 2 * timeout_s. A failed collective raises (process 0 or another follower is gone)."""
        wait_s = first_wait_s
        while True:
            plan = self._receive(wait_s)
            wait_s = 2 * self.timeout_s
            if plan.kind in stops:
                return plan.kind
            self._run(plan)

    def _receive(self, wait_s: Optional[float]) -> StepPlan:
        if wait_s is None:
            return self.channel.receive()
        with self.watchdog.guard("the next plan from process 0", timeout_s=wait_s):
            return self.channel.receive()

    def _run(self, plan: StepPlan) -> None:
        if plan.kind == PlanKind.STEP:
            assert plan.bucket is not None and plan.inputs is not None
            with self.watchdog.guard("a step"):
                jax.block_until_ready(self.runners[plan.rank].compute_logits(plan.bucket, plan.inputs))
            self.num_steps += 1
        elif plan.kind == PlanKind.COPY_BLOCKS:
            assert plan.copies is not None
            with self.watchdog.guard("a block copy"):
                self.runners[plan.rank].copy_blocks(plan.copies)
                jax.block_until_ready(self.runners[plan.rank].kv_cache)
        # HEARTBEAT (and BATCH_DONE, where the caller does not stop on it): nothing to run


def run_follower(loaded: LoadedModel, config: EngineConfig) -> int:
    """A serving follower's whole life: warm up, run process 0's plans until SHUTDOWN; returns the exit code."""
    follower = Follower(loaded, config)
    print(f"jaxpaged: process {jax.process_index()} of {jax.process_count()} is following process 0 "
          f"(serves nothing; exits when process 0 does)", flush=True)
    try:
        follower.run_until({PlanKind.SHUTDOWN}, first_wait_s=2 * follower.timeout_s)
    except Exception:  # a collective failed: process 0 (or another follower) is gone
        logger.exception("process %d: lost the job after %d steps", jax.process_index(), follower.num_steps)
        return EXIT_LEADER_LOST
    logger.info("process 0 is shutting down after %d steps; exiting", follower.num_steps)
    return 0
