"""Waiting for a server child process to answer /health (shared by the live-server harnesses)."""

import subprocess
import time
from collections.abc import Callable, Sequence

import httpx


def wait_healthy(base_url: str, processes: Sequence[subprocess.Popen], log_tail: Callable[[int], str],
                 timeout_s: float) -> None:
    """Returns once base_url/health answers 200; AssertionError with the log of a process that exited, or of process
    0 when timeout_s passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for index, process in enumerate(processes):
            if process.poll() is not None:
                raise AssertionError(f"process {index} exited with {process.returncode}:\n{log_tail(index)}")
        try:
            if httpx.get(base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not healthy after {timeout_s}s:\n{log_tail(0)}")
