"""A follower process: same model, same meshes, same compiled steps as process 0; it runs whatever plan
process 0 broadcasts and nothing else. It never tokenizes, schedules, samples or listens on a port.

It exits 0 on process 0's SHUTDOWN plan, and EXIT_LEADER_LOST when process 0 is gone: a collective that fails
(the connection dropped) or no plan for 2 * timeout_s (process 0 sends a heartbeat every timeout_s / 3 when idle).
"""

import logging
import os

import jax

from jaxpaged.config import EngineConfig
from jaxpaged.multihost.runtime import EXIT_LEADER_LOST
from jaxpaged.multihost.step_plan import PlanKind, StepPlanChannel
from jaxpaged.multihost.watchdog import CollectiveWatchdog
from jaxpaged.runner.model_runner import build_rank_runners
from jaxpaged.weights.loader import LoadedModel

logger = logging.getLogger(__name__)


def _leader_lost(what: str) -> None:
    logger.critical("process %d: process 0 stopped answering (%s); exiting", jax.process_index(), what)
    os._exit(EXIT_LEADER_LOST)


def run_follower(loaded: LoadedModel, config: EngineConfig, timeout_s: float) -> int:
    """Warm up exactly as process 0 does, then run its plans until it says SHUTDOWN; returns the exit code."""
    runners = build_rank_runners(loaded, config)
    for runner in runners:
        runner.warmup(sampler=False)
    channel = StepPlanChannel(runners[0].ladder.buckets(), runners[0].blocks_per_seq)
    watchdog = CollectiveWatchdog(timeout_s, _leader_lost)
    with watchdog.guard("process 0's warm-up", timeout_s=max(300.0, timeout_s)):  # it also compiles its sampler
        channel.warm_up()
    print(f"jaxpaged: process {jax.process_index()} of {jax.process_count()} is following process 0 "
          f"(serves nothing; exits when process 0 does)", flush=True)
    num_steps = 0
    try:
        while True:
            with watchdog.guard("the next plan from process 0", timeout_s=2 * timeout_s):
                plan = channel.receive()
            if plan.kind == PlanKind.SHUTDOWN:
                logger.info("process 0 is shutting down after %d steps; exiting", num_steps)
                return 0
            if plan.kind == PlanKind.STEP:
                assert plan.bucket is not None and plan.inputs is not None
                with watchdog.guard("a step"):
                    jax.block_until_ready(runners[plan.rank].compute_logits(plan.bucket, plan.inputs))
                num_steps += 1
            elif plan.kind == PlanKind.COPY_BLOCKS:
                assert plan.copies is not None
                with watchdog.guard("a block copy"):
                    runners[plan.rank].copy_blocks(plan.copies)
                    jax.block_until_ready(runners[plan.rank].kv_cache)
    except Exception:  # a collective failed: process 0 (or another follower) is gone
        logger.exception("process %d: lost the job after %d steps", jax.process_index(), num_steps)
        return EXIT_LEADER_LOST
