"""Fail-stop on one host: an engine that failed, or a step that hangs, ends the server process.

A failed step already ends every stream with an error and makes new requests 503; a process that then stays up
looks alive to an orchestrator and is never replaced. So, as vLLM does, the server exits: it answers 503 (on
/health too) for DRAIN_S so clients and load balancers see why, then exits with EXIT_ENGINE_FAILED. A step
running past the step timeout is taken for hung (a device or a collective that will not return): its requests
fail, /health says so at once, and the process exits the same way. Multi-host serving has its own watchdog for
lost followers (server/multihost.py), which covers a failed step too.
"""

import logging
import threading
import time
from collections.abc import Callable

from jaxpaged.async_engine import AsyncLLMEngine, EngineDeadError
from jaxpaged.server.multihost import DRAIN_S, exit_at_once

logger = logging.getLogger(__name__)

EXIT_ENGINE_FAILED = 5
"""The server's exit code when its engine failed or a step hung (3 and 4 are multi-host's)."""
DEFAULT_STEP_TIMEOUT_S = 600.0
"""A step taking longer is hung: far beyond any step after warm-up (no compile happens while serving)."""


def watch_engine(async_engine: AsyncLLMEngine, step_timeout_s: float, *, drain_s: float = DRAIN_S,
                 exit_process: Callable[[int], None] = exit_at_once, poll_s: float = 0.1) -> threading.Thread:
    """Starts the watchdog thread (daemon); `exit_process` is called once with EXIT_ENGINE_FAILED."""

    def watch() -> None:
        while async_engine.error is None:
            if not async_engine.is_alive and async_engine.error is None:
                return  # shutting down on purpose (or never started)
            running = async_engine.step_running_s()
            if running > step_timeout_s:
                async_engine.abandon(EngineDeadError(f"an engine step has run for {running:.0f} s (step timeout "
                                                     f"{step_timeout_s:g} s): taken for hung"))
                break
            time.sleep(poll_s)
        logger.critical("the engine stopped (%s); answering 503 for %.0f s, then exiting with code %d",
                        async_engine.error, drain_s, EXIT_ENGINE_FAILED)
        time.sleep(drain_s)
        exit_process(EXIT_ENGINE_FAILED)

    thread = threading.Thread(target=watch, name="jaxpaged-fail-stop", daemon=True)
    thread.start()
    return thread

