"""A `jaxpaged serve` subprocess on 127.0.0.1 and a free port: start, wait for /health, scrape /metrics, SIGTERM.

The server compiles every bucket before it opens its port, so /health answering 200 means warm.
"""

import contextlib
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Optional, TextIO

import httpx

# EngineConfig option -> `jaxpaged serve` flag (every option has one; see jaxpaged/cli_options.py).
_BOOL_FLAGS = {"enable_prefix_caching": (None, "--no-prefix-caching")}


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(model: Optional[str], engine_options: dict, port: int) -> list[str]:
    """The argv of `jaxpaged serve` for these engine options."""
    command = [sys.executable, "-m", "jaxpaged.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning"]
    if model is not None:
        command += ["--model", model]
    for name, value in sorted(engine_options.items()):
        if name in _BOOL_FLAGS:
            flag = _BOOL_FLAGS[name][0 if value else 1]
            if flag:
                command.append(flag)
        else:
            command += ["--" + name.replace("_", "-"), str(value)]
    return command


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric family name: value} for unlabelled samples (counters without _total)."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels and sample.name in (family.name, family.name + "_total"):
                values[family.name] = sample.value
    return values


class ServerProcess:
    """A running `jaxpaged serve`; use as a context manager (SIGTERM, then SIGKILL after a grace period)."""

    name = "jaxpaged serve"
    """What the messages call the server (a peer's server is a subclass with its own command)."""
    env: Optional[dict] = None
    """The server's environment (None: ours)."""

    def __init__(self, model: Optional[str], engine_options: dict, log_path: pathlib.Path,
                 start_timeout_s: float = 900.0):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = serve_command(model, engine_options, self.port)
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.startup_s: Optional[float] = None
        """Seconds from spawn to the first healthy /health (load + compile)."""
        self._process: Optional[subprocess.Popen] = None
        self._log: Optional[TextIO] = None

    def __enter__(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w")
        start = time.perf_counter()
        self._process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        try:
            self._wait_healthy(start)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.startup_s = time.perf_counter() - start
        return self

    def _wait_healthy(self, start: float) -> None:
        process = self._process
        assert process is not None  # spawned by __enter__
        # One client for every poll: httpx.get builds a client and its SSL context per call (~23 ms of CPU), taken
        # from the cores the starting server (whose start-up is measured) runs on.
        with httpx.Client(timeout=2.0) as client:
            while time.perf_counter() - start < self.start_timeout_s:
                if process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {process.returncode} before it was ready; "
                                       f"log {self.log_path}:\n{self._log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.base_url + "/health").status_code == 200:
                        return
                time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not healthy after {self.start_timeout_s:.0f} s; log {self.log_path}")

    def _log_tail(self, num_lines: int = 20) -> str:
        if self._log is not None:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    @property
    def pid(self) -> int:
        """The server's process id (while it runs)."""
        assert self._process is not None  # spawned by __enter__
        return self._process.pid

    def metrics(self) -> dict[str, float]:
        """The server's /metrics, parsed."""
        return parse_metrics(httpx.get(self.base_url + "/metrics", timeout=10.0).text)

    def __exit__(self, *exc_info) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
