"""Slow clients cannot hold the server: a body that stalls after its headers gets 408 and a closed connection
within --request-body-timeout while others are served, headers that never complete get the connection closed
within --request-header-timeout, and beyond --limit-concurrency open connections new requests get 503 until some
close."""

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from jaxpaged.server import ServerSettings, build_app
from jaxpaged.server.http.header_deadline import header_deadline_protocol
from tests.server.server_helpers import ServerThread

pytestmark = pytest.mark.xdist_group("server")

BODY_TIMEOUT_S = 1.0
LIMIT_CONCURRENCY = 4
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def strict_server(async_engine) -> Iterator[ServerThread]:
    """A server with a 1 s body deadline and room for 4 connections."""
    app = build_app(async_engine, ServerSettings(request_body_timeout_s=BODY_TIMEOUT_S))
    with ServerThread(app, limit_concurrency=LIMIT_CONCURRENCY) as running:
        yield running


def _stalled_post(port: int) -> socket.socket:
    """A raw connection that sent its headers and a third of the body it announced, then stops."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       b"Content-Length: 60\r\n\r\n" + b'{"prompt": "hello", "max_tok')
    return connection


def _read_until_closed(connection: socket.socket) -> bytes:
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def test_a_stalled_body_gets_408_and_a_closed_connection_while_others_are_served(strict_server, model_name):
    answers: list[tuple[bytes, float]] = []
    with _stalled_post(strict_server.port) as stalled:
        started = time.monotonic()
        reader = threading.Thread(target=lambda: answers.append((_read_until_closed(stalled), time.monotonic())))
        reader.start()
        with httpx.Client(base_url=strict_server.base_url, timeout=60) as session:
            served = session.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 1})
            assert served.status_code == 200
        reader.join(30)
    (answer, closed_at), = answers  # the server closed the connection
    assert BODY_TIMEOUT_S * 0.9 <= closed_at - started < BODY_TIMEOUT_S + 5
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower()
    assert b'"code":"request_timeout"' in body.replace(b" ", b"")


def test_a_body_trickling_past_the_deadline_is_cut_off(strict_server):
    """The deadline bounds the whole body, not the gap between its pieces: a byte every 0.3 s still ends."""
    with _stalled_post(strict_server.port) as trickling:
        started = time.monotonic()
        with pytest.raises(OSError):  # the server closes mid-trickle (a reset or a broken pipe)
            for _ in range(20):
                trickling.sendall(b" ")
                time.sleep(0.3)
        assert time.monotonic() - started < BODY_TIMEOUT_S + 5


def test_connections_beyond_limit_concurrency_get_503_until_some_close(strict_server):
    idle = [socket.create_connection(("127.0.0.1", strict_server.port)) for _ in range(LIMIT_CONCURRENCY)]
    try:
        time.sleep(0.2)  # the server has accepted them all
        assert httpx.get(strict_server.base_url + "/health", timeout=30).status_code == 503
    finally:
        for connection in idle:
            connection.close()
    deadline = time.monotonic() + 10
    while httpx.get(strict_server.base_url + "/health", timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the closed connections still count"
        time.sleep(0.1)


def test_a_body_within_the_deadline_is_unaffected(strict_server, model_name):
    """A streamed response outlives the body deadline: once the body is in, receive() only watches for a
    disconnect."""
    body = {"model": model_name, "prompt": "hi", "max_tokens": 48, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=strict_server.base_url, timeout=60) as session:
        with session.stream("POST", "/v1/completions", json=body) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200 and lines[-1] == "data: [DONE]"


@pytest.fixture(scope="module")
def header_deadline_server(async_engine) -> Iterator[ServerThread]:
    """A server whose connections must send a request's headers within 1 s."""
    with ServerThread(build_app(async_engine, ServerSettings()),
                      http=header_deadline_protocol(HEADER_TIMEOUT_S)) as running:
        yield running


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Ty"],
                         ids=["nothing", "partial-headers"])
def test_a_connection_without_complete_headers_is_closed(header_deadline_server, sent):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", header_deadline_server.port), timeout=30) as slow:
        slow.sendall(sent)
        assert _read_until_closed(slow) == b""
    assert HEADER_TIMEOUT_S * 0.9 <= time.monotonic() - started < HEADER_TIMEOUT_S + 5
    assert httpx.get(header_deadline_server.base_url + "/health", timeout=30).status_code == 200


def test_the_next_request_on_a_kept_alive_connection_has_its_own_header_deadline(header_deadline_server):
    """After a response, partial headers of the next request (which stop uvicorn's keep-alive timer) are cut off
    too."""
    with socket.create_connection(("127.0.0.1", header_deadline_server.port), timeout=30) as kept:
        time.sleep(HEADER_TIMEOUT_S * 0.6)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        kept.sendall(b"GET /health HTTP/1.1\r\nHo")
        assert _read_until_closed(kept) == b""
    assert HEADER_TIMEOUT_S * 0.9 <= time.monotonic() - started < HEADER_TIMEOUT_S + 5


def test_a_request_whose_headers_arrived_is_not_cut_by_the_header_deadline(header_deadline_server, model_name):
    """Past the header deadline, a request in progress (its body still coming, within its own deadline) is served."""
    body = json.dumps({"model": model_name, "prompt": "hi", "max_tokens": 1}).encode()
    with socket.create_connection(("127.0.0.1", header_deadline_server.port), timeout=30) as unhurried:
        unhurried.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                          b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(HEADER_TIMEOUT_S * 2)
        unhurried.sendall(body[10:])
        assert _read_until_closed(unhurried).startswith(b"HTTP/1.1 200")
