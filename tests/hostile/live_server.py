"""A real `python -m jaxpaged.server` child process for the hostile-client suite (a plain module with a unique name).

Each attack file starts one server with the flags its attacks need, sends the attack as written in issue 56, and
then checks that the process is alive and that a normal greedy request still gets the answer it got before the
attack. The child always dies with the test: `LiveServer` kills its process group on exit.
"""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import httpx

from tests.server_health import wait_healthy

API_KEY = "hostile-key-5e1f0c2a"
STARTUP_TIMEOUT_S = 300.0
NORMAL_PROMPT = "The capital of France is"
CRASH_REGEX = "crash-the-grammar-worker"
"""The one regex whose grammar crashes the grammar worker in a server started with the crash hook armed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LiveServer:
    """`jaxpaged serve` on a tiny model in a child process, on 127.0.0.1, with an API key."""

    def __init__(self, model_dir: Path, log_path: Path, *flags: str, api_key: Optional[str] = API_KEY,
                 env: Optional[dict[str, str]] = None) -> None:
        """flags: extra serve flags; env: extra environment variables for the child."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        key_flags = ["--api-key", api_key] if api_key else []
        self.command = [sys.executable, "-m", "jaxpaged.server", "--model", str(model_dir), "--port", str(self.port),
                        "--max-model-len", "256", "--max-num-seqs", "8", "--max-num-batched-tokens", "64",
                        "--dtype", "float32", "--attention-backend", "xla", "--compilation-cache-dir", "",
                        *key_flags, *flags]
        self.env = {**os.environ, **(env or {})}
        self.process: Optional[subprocess.Popen] = None
        self.baseline_text: Optional[str] = None

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header of a client that holds the key."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def __enter__(self) -> "LiveServer":
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        try:
            wait_healthy(self.base_url, [self.process], lambda _: self.log_tail(), STARTUP_TIMEOUT_S)
            self.baseline_text = self.normal_completion()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def log_tail(self, num_chars: int = 4000) -> str:
        """The end of the child's combined stdout and stderr."""
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def post(self, path: str, body: Any, timeout: float = 120.0, **kwargs: Any) -> httpx.Response:
        """POSTs a JSON body with the key."""
        return httpx.post(self.base_url + path, json=body, headers=self.headers, timeout=timeout, **kwargs)

    def normal_completion(self) -> str:
        """A greedy 8-token completion of NORMAL_PROMPT: the request every attack must leave answerable."""
        response = self.post("/v1/completions", {"prompt": NORMAL_PROMPT, "max_tokens": 8, "temperature": 0})
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    def assert_still_serving(self) -> None:
        """The process is alive, /health answers, and the normal request gets the same greedy text as before."""
        assert self.process is not None and self.process.poll() is None, (
            f"server died with {self.process and self.process.returncode}:\n{self.log_tail()}")
        assert httpx.get(self.base_url + "/health", timeout=10).status_code == 200
        assert self.normal_completion() == self.baseline_text
