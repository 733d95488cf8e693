"""A deadline on calls that wait for another process.

A collective whose peer has died usually fails at once (the TCP connection resets), but one whose peer hangs
blocks forever and cannot be cancelled from Python. So a thread watches the deadline of the call in progress
and, when it passes, runs `on_expire` exactly once; that handler ends the process (after failing what it can).
"""

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Optional

logger = logging.getLogger(__name__)


class CollectiveWatchdog:
    """Runs `on_expire(what)` once if a guarded call is still running `timeout_s` after it began."""

    def __init__(self, timeout_s: float, on_expire: Callable[[str], None]) -> None:
        self.timeout_s = timeout_s
        self.on_expire = on_expire
        """Replaceable until it first fires (the server installs one that fails requests before exiting)."""
        self._condition = threading.Condition()
        self._deadline: Optional[float] = None
        self._what = ""
        self._thread = threading.Thread(target=self._watch, name="jaxpaged-collective-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def guard(self, what: str, timeout_s: Optional[float] = None) -> Iterator[None]:
        """Bounds the body's run time (default: this watchdog's timeout); `what` names it in the error."""
        with self._condition:
            limit = self.timeout_s if timeout_s is None else timeout_s
            self._deadline = time.monotonic() + limit
            self._what = f"{what} (after {limit:.1f} s)"
            self._condition.notify()
        try:
            yield
        finally:
            with self._condition:
                self._deadline = None

    def _watch(self) -> None:
        with self._condition:
            while True:
                if self._deadline is None:
                    self._condition.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._condition.wait(left)
                    continue
                what, self._deadline = self._what, None
                break
        logger.critical("gave up waiting for %s", what)
        self.on_expire(what)
