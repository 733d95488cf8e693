"""A single-host server that cannot serve says so and goes away, so an orchestrator restarts it (as vLLM's does).

  - fail-stop: when the engine loop fails (a step raised), streams already got an error and new requests 503;
    one request's own failure does not reach here (engine/request_failures.py fails that request alone);
    the process then answers 503 on /health for FAIL_STOP_DRAIN_S, so clients and load balancers see why, and exits
    with EXIT_ENGINE_FAILED (multi-host serving has its own fail-stop, server/multihost.py);
  - stall: a step that hangs raises nothing, so /health answers 503 once no step has completed for
    --engine-step-timeout seconds while requests are pending (the loop is not dead: it may still recover).
"""

import logging
import threading
import time

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.server.multihost import exit_at_once

logger = logging.getLogger(__name__)

EXIT_ENGINE_FAILED = 5
"""The exit code of a server whose engine loop failed."""

FAIL_STOP_DRAIN_S = 2.0
"""Seconds the server keeps answering 503 after its engine loop failed, before it exits."""

DEFAULT_ENGINE_STEP_TIMEOUT_S = 120.0
"""/health answers 503 after this many seconds without a finished step while requests are pending: generous, as
a long prefill on a slow host is not a hang."""

_POLL_S = 0.1


def fail_stop_on_engine_failure(async_engine: AsyncLLMEngine, drain_s: float = FAIL_STOP_DRAIN_S) -> threading.Thread:
    """Starts the thread that exits the process with EXIT_ENGINE_FAILED drain_s after the engine loop fails."""

    def watch() -> None:
        while async_engine.error is None:
            time.sleep(_POLL_S)
        error = async_engine.error
        logger.critical("the engine loop failed (%s); answering 503 for %.0f s, then exiting with code %d",
                        type(error).__name__, drain_s, EXIT_ENGINE_FAILED)
        time.sleep(drain_s)
        exit_at_once(EXIT_ENGINE_FAILED)

    watcher = threading.Thread(target=watch, name="jaxpaged-fail-stop", daemon=True)
    watcher.start()
    return watcher
