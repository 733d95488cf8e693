"""`python -m jaxpaged.server` in a child process: the banner, the env API key, and graceful SIGTERM (stop
accepting, finish the stream in flight, exit 0). A tiny random model keeps the child's start-up short."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.server_health import wait_healthy

API_KEY = "env-key-90b1d3c5"
STARTUP_TIMEOUT_S = 300
MAX_TOKENS = 40


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_healthy(base_url: str, process: subprocess.Popen, log_path) -> None:
    try:
        wait_healthy(base_url, [process], lambda _: log_path.read_text()[-3000:], STARTUP_TIMEOUT_S)
    except AssertionError as error:
        process.kill()
        pytest.fail(f"server not ready: {error}")


def _server_command(model_dir, port: int, *flags: str, module: str = "jaxpaged.server") -> list[str]:
    # The engine options of tests/hostile/live_server.py's servers on the same model: the child's warm-up then loads
    # their programs from the session's XLA cache instead of compiling a set of its own (nothing here needs others).
    return [sys.executable, "-m", module, "--model", str(model_dir), "--port", str(port),
            "--max-model-len", "256", "--max-num-seqs", "8", "--max-num-batched-tokens", "64",
            "--dtype", "float32", "--attention-backend", "xla", "--compilation-cache-dir", "", *flags]


def test_sigterm_drains_and_exits_0(tiny_model_dir, tmp_path):
    """SIGTERM mid-stream: the stream still ends with all its tokens and [DONE], new requests are refused
    (503 or connection refused), the process exits 0, and the key from the environment never shows."""
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    command = _server_command(tiny_model_dir, port)
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "JAXPAGED_API_KEY": API_KEY})
    try:
        _wait_healthy(base_url, process, log_path)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        assert httpx.get(base_url + "/v1/models").status_code == 401
        assert httpx.get(base_url + "/v1/models", headers=headers).status_code == 200

        first_chunk, events = threading.Event(), []

        def stream() -> None:
            body = {"prompt": "hello", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", base_url + "/v1/completions", json=body, headers=headers,
                              timeout=120) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
                        first_chunk.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first_chunk.wait(60)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        try:
            late = httpx.get(base_url + "/health", timeout=5)
            assert late.status_code == 503
        except httpx.TransportError:
            pass  # the listening socket is already closed: also a refusal
        reader.join(120)
        assert process.wait(120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    log_text = log_path.read_text()
    assert "curl http://127.0.0.1:" in log_text and "$JAXPAGED_API_KEY" in log_text
    assert API_KEY not in log_text


def test_the_drain_is_bounded_by_shutdown_timeout(tiny_model_dir, tmp_path):
    """A request that cannot finish (its body stalls, with a long body deadline) holds a SIGTERM drain for
    --shutdown-timeout at most: then it is cancelled and the process exits 0."""
    port = _free_port()
    log_path = tmp_path / "server.log"
    command = _server_command(tiny_model_dir, port, "--shutdown-timeout", "2", "--request-body-timeout", "600")
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", process, log_path)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as stalled:
            stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 60\r\n\r\n{\"prompt\": ")
            time.sleep(0.5)  # the request is in flight, waiting for the rest of its body
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
            assert time.monotonic() - started < 2 + 15
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_failed_engine_loop_exits_the_process_non_zero(tiny_model_dir, tmp_path):
    """When an engine step raises, the request gets an error, /health turns 503, and the process exits with
    EXIT_ENGINE_FAILED within ~5 s, so an orchestrator restarts it."""
    from jaxpaged.server.watchdog import EXIT_ENGINE_FAILED

    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(_server_command(tiny_model_dir, port, module="tests.server.faulty_server"),
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(base_url, process, log_path)
        failed = httpx.post(base_url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=60)
        failed_at = time.monotonic()
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "engine_unavailable"
        try:
            assert httpx.get(base_url + "/health", timeout=5).status_code == 503
        except httpx.TransportError:
            pass  # already gone
        assert process.wait(30) == EXIT_ENGINE_FAILED
        assert time.monotonic() - failed_at < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "the engine loop failed (RuntimeError)" in log_path.read_text()
