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
    # One client for every poll: httpx.get builds a client, and its SSL context, per call (~23 ms of CPU each; a
    # cluster's start-up of minutes on a loaded machine polled away seconds of the 2 cores the servers compile on).
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            for index, process in enumerate(processes):
                if process.poll() is not None:
                    raise AssertionError(f"process {index} exited with {process.returncode}:\n{log_tail(index)}")
            try:
                if client.get(base_url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    raise AssertionError(f"not healthy after {timeout_s}s:\n{log_tail(0)}")
