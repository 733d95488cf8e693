"""Helpers for the KV events socket tests: a free loopback endpoint, a publisher on it, and a subscriber that
waits for what the publisher keeps sending (a ZeroMQ subscription takes effect only once the publisher reads it)."""

import json
import socket
import time
from typing import Any, Optional

import zmq

from jaxpaged.features.kv_events_publisher import ZmqEventPublisher
from jaxpaged.kv_events_config import parse_kv_events_config

TOPIC = "kv"


def free_endpoint() -> str:
    """A tcp://127.0.0.1 address nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def publisher(endpoint: str, **options: Any) -> ZmqEventPublisher:
    """A publisher bound on `endpoint` with TOPIC and the given config keys."""
    text = json.dumps({"enable_kv_cache_events": True, "endpoint": endpoint, "bind": True, "topic": TOPIC, **options})
    return ZmqEventPublisher(parse_kv_events_config(text))


def subscriber(endpoint: str, keys: Optional[tuple[bytes, bytes, bytes]] = None, rcvhwm: int = 1000) -> Any:
    """A SUB socket on TOPIC; keys: (its public key, its secret key, the server's public key) for CURVE."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, rcvhwm)
    if keys is not None:
        sub.curve_publickey, sub.curve_secretkey, sub.curve_serverkey = keys
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.connect(endpoint)
    return sub


def receive_while_publishing(pub: ZmqEventPublisher, sub: Any, payload: bytes, timeout_s: float) -> Optional[list]:
    """Publishes `payload` every 20 ms until `sub` receives a message (returned) or timeout_s passes (None)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pub.publish([payload])
        if sub.poll(20):
            return sub.recv_multipart()
    return None
