"""Helpers of the server tests (a plain module with a unique name, so imports cannot pick another conftest)."""

import socket
import threading
import time
from typing import Any

import uvicorn

from jaxpaged.async_engine import AsyncLLMEngine

SERVER_ENGINE_OPTIONS: dict[str, Any] = dict(
    max_model_len=512, max_num_seqs=32, max_num_batched_tokens=256, dtype="float32", attention_backend="xla",
    compilation_cache_dir="")
API_KEY = "test-key-2c9d41f7e3"
IDLE_TIMEOUT_S = 60.0


class ServerThread:
    """uvicorn serving one app from a background thread, on a socket bound here (no port race)."""

    def __init__(self, app, **uvicorn_options: Any) -> None:
        """uvicorn_options: uvicorn.Config's keywords (limit_concurrency, ...)."""
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **uvicorn_options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def wait_until_idle(engine: AsyncLLMEngine, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Waits until nothing runs or waits and no KV block is held by a request; fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = engine.get_stats()
        if (stats is not None and engine.num_unfinished_seqs == 0 and stats.num_running == 0 and stats.num_waiting == 0
                and stats.kv_cache_usage == 0.0):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle after {timeout_s}s: {stats}, "
                                 f"unfinished seqs {engine.num_unfinished_seqs}")
        time.sleep(0.05)
