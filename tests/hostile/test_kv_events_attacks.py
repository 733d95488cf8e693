"""Issue 56, finding 3 against a live server: a subscriber without the right key reads no KV events, and with
redaction on no received frame holds a salted tenant's raw salt or any token id; the server keeps serving."""

import json
import time

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
zmq_auth = pytest.importorskip("zmq.auth")

from tests.engine.kv_events_sockets import TOPIC, free_endpoint, subscriber  # noqa: E402
from tests.hostile.live_server import LiveServer  # noqa: E402

SALT = "tenant-salt-6f1d9a0b3c"
PROMPT_TOKEN_IDS = list(range(1000, 1064))  # four full blocks of 16, in the redaction test (new to the cache)


@pytest.fixture(scope="module")
def curve_server(tmp_path_factory, tiny_model_dir):
    """A live server publishing redacted KV events over CURVE on a loopback port, and the authorized client's keys
    (its public key, its secret key, the server's public key)."""
    keys = tmp_path_factory.mktemp("kv-keys")
    authorized = keys / "authorized"
    authorized.mkdir()
    _, server_secret = zmq_auth.create_certificates(str(keys), "server")
    _, client_secret = zmq_auth.create_certificates(str(authorized), "router")
    client_public, client_secret_key = zmq_auth.load_certificate(client_secret)
    server_public, _ = zmq_auth.load_certificate(server_secret)
    endpoint = free_endpoint()
    config = {"enable_kv_cache_events": True, "endpoint": endpoint, "bind": True, "topic": TOPIC, "redact": True,
              "curve_secret_key_file": server_secret, "curve_authorized_keys_dir": str(authorized)}
    log_path = tmp_path_factory.mktemp("kv-events-server") / "server.log"
    with LiveServer(tiny_model_dir, log_path, "--kv-events-config", json.dumps(config)) as server:
        yield server, endpoint, (client_public, client_secret_key, server_public)


def _collect(sockets: list, seconds: float) -> list[list[list[bytes]]]:
    """Every message each socket receives within `seconds`."""
    received: list[list[list[bytes]]] = [[] for _ in sockets]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for index, sock in enumerate(sockets):
            while sock.poll(10):
                received[index].append(sock.recv_multipart())
    return received


def _salted_request_events(server: LiveServer, sockets: list, prompt: list[int]) -> list[list[list[bytes]]]:
    """What each socket receives around one salted completion of `prompt` (the sockets are closed)."""
    try:
        time.sleep(1.0)  # the CURVE handshakes finish before the request's first step
        response = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                                   "ignore_eos": True, "cache_salt": SALT})
        assert response.status_code == 200, response.text
        return _collect(sockets, 3.0)
    finally:
        for sock in sockets:
            sock.close()


def test_subscriber_without_an_authorized_key_reads_nothing(curve_server):
    """From 127.0.0.1, a plain subscriber and one with a key that is not authorized get no frame while the
    authorized router gets the request's events."""
    server, endpoint, router_keys = curve_server
    stranger_public, stranger_secret = zmq.curve_keypair()
    router, plain, stranger = _salted_request_events(server, [
        subscriber(endpoint, router_keys), subscriber(endpoint),
        subscriber(endpoint, (stranger_public, stranger_secret, router_keys[2]))], list(range(3000, 3040)))
    assert router and (plain, stranger) == ([], [])
    server.assert_still_serving()


def test_redacted_frames_hold_no_salt_and_no_token_ids(curve_server):
    """With redaction on, the router gets the salted request's blocks as hashes with no token ids and an HMAC in
    place of the salt; neither the salt nor the prompt's ids appear in any frame."""
    server, endpoint, router_keys = curve_server
    (router,) = _salted_request_events(server, [subscriber(endpoint, router_keys)], PROMPT_TOKEN_IDS)
    stored = [event for *_, payload in router for event in msgpack.unpackb(payload)[1]
              if event["type"] == "BlockStored"]
    assert len(stored) >= len(PROMPT_TOKEN_IDS) // 16  # the prompt's blocks, at least
    assert {tuple(event["token_ids"]) for event in stored} == {()}
    salted = [keys for event in stored for keys in event["extra_keys"] if keys is not None]
    assert salted and all(keys[0] == "cache_salt" and keys[1].startswith("hmac-sha256:") for keys in salted)
    first_ids = msgpack.packb(PROMPT_TOKEN_IDS[:2])[1:]  # the first two prompt ids as msgpack writes them
    for frame in (frame for message in router for frame in message):
        assert SALT.encode() not in frame and first_ids not in frame
    server.assert_still_serving()
