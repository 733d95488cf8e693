"""serve_main's multi-host parts: the follower role, and process 0's fail-stop.

Fail-stop: when a follower is lost (see multihost/leader.py for how fast that is noticed), process 0 ends every
request in flight with an error, answers 503 on /health for DRAIN_S so clients and load balancers see why, and
exits with EXIT_FOLLOWER_LOST. A job with a missing host cannot run a step, so it never waits to recover.
"""

import argparse
import logging
import os
import sys
import threading
import time

from jaxpaged.async_engine import AsyncLLMEngine, EngineDeadError
from jaxpaged.config import EngineConfig
from jaxpaged.multihost.leader import FollowerLink
from jaxpaged.multihost.runtime import EXIT_FOLLOWER_LOST

logger = logging.getLogger(__name__)

DRAIN_S = 2.0
"""Seconds process 0 keeps answering 503 after losing a follower, before it exits."""


def follow(args: argparse.Namespace, config: EngineConfig) -> int:
    """A follower process's whole life: load the same model, warm up, run process 0's plans, exit."""
    from jaxpaged.engine import enable_persistent_compilation_cache
    from jaxpaged.multihost.follower import run_follower
    from jaxpaged.weights.loader import load_model

    if config.compilation_cache_dir != "":
        enable_persistent_compilation_cache(config.compilation_cache_dir)
    loaded = load_model(args.model, revision=getattr(args, "revision", None), quantization=config.quantization)
    return run_follower(loaded, config)


def exit_at_once(code: int) -> None:
    """Exits without jax.distributed's shutdown barrier, which would wait for the lost process."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail_stop_on_lost_follower(async_engine: AsyncLLMEngine, followers: FollowerLink) -> None:
    """Process 0: a hung follower (the watchdog) or a dead one (a failed step) ends the server, as above."""

    def on_lost(what: str) -> None:
        async_engine.abandon(EngineDeadError(f"a follower process stopped answering ({what})"))

    def watch() -> None:
        while async_engine.error is None:
            time.sleep(0.1)
        logger.critical("lost a follower process (%s); answering 503 for %.0f s, then exiting with code %d",
                        async_engine.error, DRAIN_S, EXIT_FOLLOWER_LOST)
        time.sleep(DRAIN_S)
        exit_at_once(EXIT_FOLLOWER_LOST)

    followers.set_on_lost(on_lost)
    threading.Thread(target=watch, name="jaxpaged-fail-stop", daemon=True).start()
