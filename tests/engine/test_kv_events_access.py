"""Who can read the KV events and what they show (issue 56): the default endpoint binds where HTTP listens, CURVE
admits only the authorized keys, and redaction leaves out the token ids and the raw cache salt."""

import json
import logging

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
zmq_auth = pytest.importorskip("zmq.auth")

from jaxpaged.core.kv_events import KVEventLog  # noqa: E402
from jaxpaged.features.kv_events import encode_batch  # noqa: E402
from jaxpaged.features.kv_events_redaction import DIGEST_PREFIX, EventRedactor, load_redaction_key  # noqa: E402
from jaxpaged.kv_events_config import KVEventsConfig, kv_events_on_http_host, parse_kv_events_config  # noqa: E402
from tests.engine.kv_events_sockets import free_endpoint, publisher, receive_while_publishing, subscriber  # noqa: E402

ENABLED = '{"enable_kv_cache_events": true, "topic": "kv"}'


def test_default_endpoint_is_bound_on_loopback():
    """With no endpoint, a library engine binds tcp://127.0.0.1:5557, not every interface as vLLM does."""
    config = parse_kv_events_config(ENABLED)
    assert (config.resolved_endpoint(), config.binds(), config.leaves_loopback()) == (
        "tcp://127.0.0.1:5557", True, False)


@pytest.mark.parametrize("host, endpoint", [("127.0.0.1", "tcp://127.0.0.1:5557"), ("0.0.0.0", "tcp://*:5557"),
                                            ("10.1.2.3", "tcp://10.1.2.3:5557"), ("::1", "tcp://[::1]:5557"),
                                            ("::", "tcp://*:5557"), ("localhost", "tcp://localhost:5557")])
def test_serve_binds_the_default_endpoint_on_the_http_host(host, endpoint):
    """`serve --host H` with no endpoint binds the events on H; a loopback H keeps them on loopback."""
    config = parse_kv_events_config(kv_events_on_http_host(ENABLED, host) or "")
    assert (config.resolved_endpoint(), config.binds(), config.topic) == (endpoint, True, "kv")
    assert config.leaves_loopback() == (host not in ("127.0.0.1", "::1", "localhost"))


def test_an_explicit_endpoint_is_honoured():
    """An endpoint the user gave is kept as written, with vLLM's bind-or-connect rule."""
    text = '{"enable_kv_cache_events": true, "endpoint": "tcp://router:5557"}'
    assert kv_events_on_http_host(text, "0.0.0.0") == text
    assert kv_events_on_http_host(None, "0.0.0.0") is None
    config = parse_kv_events_config(text)
    assert (config.binds(), parse_kv_events_config('{"endpoint": "tcp://*:9"}').binds()) == (False, True)


def test_unauthenticated_events_off_loopback_are_warned_about(caplog):
    """Binding every interface without CURVE logs a warning at start-up; loopback does not."""
    port = free_endpoint().rsplit(":", 1)[1]
    with caplog.at_level(logging.WARNING):
        publisher(free_endpoint()).close()
        assert "without authentication" not in caplog.text
        publisher(f"tcp://*:{port}").close()
    assert "without authentication" in caplog.text


@pytest.fixture
def curve_keys(tmp_path):
    """(server secret file, authorized dir, authorized client (public, secret), server public key)."""
    authorized, other = tmp_path / "authorized", tmp_path / "other"
    for directory in (authorized, other):
        directory.mkdir()
    _, server_secret = zmq_auth.create_certificates(str(tmp_path), "server")
    client_public, client_secret = zmq_auth.create_certificates(str(authorized), "router")
    server_public_key, _ = zmq_auth.load_certificate(server_secret)
    return server_secret, str(authorized), zmq_auth.load_certificate(client_secret), server_public_key, other


def test_curve_publisher_is_read_by_the_authorized_key_only(curve_keys):
    """A CURVE publisher reaches a client holding an authorized key; a plain client and a client with a key that
    is not authorized receive nothing."""
    server_secret, authorized, (client_public, client_secret), server_public, other = curve_keys
    endpoint = free_endpoint()
    pub = publisher(endpoint, curve_secret_key_file=server_secret, curve_authorized_keys_dir=authorized)
    stranger_public, stranger_secret = zmq_auth.load_certificate(zmq_auth.create_certificates(str(other), "x")[1])
    strangers = [subscriber(endpoint), subscriber(endpoint, (stranger_public, stranger_secret, server_public))]
    router = subscriber(endpoint, (client_public, client_secret, server_public))
    try:
        received = receive_while_publishing(pub, router, b"payload", timeout_s=10)
        assert received is not None and received[0] == b"kv" and received[2] == b"payload"
        for _ in range(25):  # half a second more of messages the strangers could have read
            pub.publish([b"payload"])
        assert [stranger.poll(200) for stranger in strangers] == [0, 0]
    finally:
        for sock in [router, *strangers]:
            sock.close()
        pub.close()


@pytest.mark.parametrize("text, message", [
    ('{"curve_secret_key_file": "x"}', "go together"),
    ('{"curve_secret_key_file": "x", "curve_authorized_keys_dir": "y", "endpoint": "inproc://e"}', "CURVE"),
    ('{"redaction_key_file": "k"}', "redact is not true"), ('{"redact": 1}', "redact"),
    ('{"hwm": 100000}', "hwm"), ('{"max_message_bytes": 10}', "max_message_bytes"),
    ('{"slow_subscriber": "block"}', "slow_subscriber")])
def test_bad_security_configs_are_refused_naming_the_field(text, message):
    """The new keys are checked with the field named (vLLM's hwm of 100,000 would pin 25 GiB per subscriber)."""
    with pytest.raises(ValueError, match=f"kv_events_config: .*{message}"):
        parse_kv_events_config(text)


def test_an_endpoint_in_use_is_a_clear_error():
    """Binding an address another publisher holds is a ValueError naming the endpoint, not a ZMQError."""
    endpoint = free_endpoint()
    first = publisher(endpoint)
    try:
        with pytest.raises(ValueError, match="kv_events_config: endpoint .* cannot be bound"):
            publisher(endpoint)
    finally:
        first.close()


def _salted_batch(redactor, salt: str) -> bytes:
    log = KVEventLog(block_size=4)
    log.stored(b"h" * 32, None, (901, 902, 903, 904), ("cache_salt", salt))
    log.stored(b"i" * 32, b"h" * 32, (905, 906, 907, 908))
    log.removed(b"h" * 32)
    events = log.take()
    return encode_batch([redactor.redact(event) for event in events] if redactor else events, 0, ts=1.0)


def test_redaction_drops_token_ids_and_the_raw_salt():
    """Redacted, a BlockStored has no token ids and a keyed digest for the salt; block hashes are unchanged."""
    redactor = EventRedactor(b"k" * 32)
    payload = _salted_batch(redactor, "tenant-secret")
    _, events, _ = msgpack.unpackb(payload)
    assert [event.get("token_ids") for event in events] == [[], [], None]
    assert [event["block_hashes"] for event in events] == [[b"h" * 32], [b"i" * 32], [b"h" * 32]]
    assert events[0]["extra_keys"] == [["cache_salt", redactor.digest("tenant-secret")]]
    assert events[1]["extra_keys"] == [None]
    assert b"tenant-secret" not in payload and b"tenant-secret" in _salted_batch(None, "tenant-secret")
    assert bytes([205, 3, 133]) not in payload  # msgpack's uint16 901, as the unredacted batch carries it
    assert bytes([205, 3, 133]) in _salted_batch(None, "tenant-secret")


def test_salt_digest_is_stable_per_salt_and_key_and_differs_otherwise(tmp_path):
    """The same salt gives the same digest (a router can group a tenant's chains); another salt or key does not."""
    import hashlib
    import hmac

    key_file = tmp_path / "key"
    key_file.write_bytes(b"shared-between-replicas-0123456789")
    first, second = EventRedactor(load_redaction_key(str(key_file))), EventRedactor(load_redaction_key(str(key_file)))
    expected = hmac.new(key_file.read_bytes(), b"tenant-a", hashlib.sha256).hexdigest()
    assert first.digest("tenant-a") == second.digest("tenant-a") == DIGEST_PREFIX + expected
    assert first.digest("tenant-a") != first.digest("tenant-b")
    assert EventRedactor(load_redaction_key(None)).digest("tenant-a") != first.digest("tenant-a")
    key_file.write_bytes(b"short")
    with pytest.raises(ValueError, match="redaction_key_file .* at least 16"):
        load_redaction_key(str(key_file))


def test_redact_config_round_trips():
    """"redact": true and a key file are accepted together (the feature builds its redactor from them)."""
    config = parse_kv_events_config(json.dumps({"redact": True, "redaction_key_file": "/k"}))
    assert (config.redact, config.redaction_key_file) == (True, "/k")
    assert KVEventsConfig().redact is False


@pytest.mark.parametrize("host_flags, endpoint", [([], "tcp://127.0.0.1:5557"),
                                                  (["--host", "0.0.0.0"], "tcp://*:5557")])
def test_serve_passes_its_http_host_to_the_events_config(monkeypatch, host_flags, endpoint):
    """`jaxpaged serve --kv-events-config {...}` with no endpoint hands the engine one bound on its --host."""
    from jaxpaged.cli import build_parser
    from jaxpaged.config import EngineConfig
    from jaxpaged.server.launcher import serve_main

    seen = {}

    def stop_at_the_config(**options):
        seen.update(options)
        raise ValueError("stopped before building the engine")

    monkeypatch.setattr(EngineConfig, "from_options", staticmethod(stop_at_the_config))
    args = build_parser().parse_args(["serve", "--model", "unused", *host_flags, "--kv-events-config", ENABLED])
    assert serve_main(args) == 2
    config = parse_kv_events_config(seen["kv_events_config"])
    assert (config.resolved_endpoint(), config.binds()) == (endpoint, True)
