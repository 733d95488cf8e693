"""vLLM's --kv-events-config: a JSON object that turns on KV cache events and says where they are published.

{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events"}

Only the keys jaxpaged acts on are accepted (a replay socket, say, is refused rather than silently missing), plus
jaxpaged's own: "event_layout", "bind", the CURVE keys, "redact", and the memory bounds.

Where jaxpaged departs from vLLM: with no "endpoint" the socket binds where the HTTP server listens (`serve` passes
its --host; a library engine binds 127.0.0.1), not on every interface, since the events carry the prompts' token ids
and the tenants' cache salts (docs/server.md, "KV cache events").
"""

import dataclasses
import ipaddress
import json
from typing import Any, Literal, Optional

PublisherName = Literal["zmq", "null"]
_PUBLISHERS = ("zmq", "null")
EventLayout = Literal["map", "array"]
_LAYOUTS = ("map", "array")
SlowSubscriberPolicy = Literal["drop", "hold"]
_SLOW_SUBSCRIBER_POLICIES = ("drop", "hold")
DEFAULT_PORT = 5557
LOOPBACK_HOST = "127.0.0.1"
_MIN_MESSAGE_BYTES = 64 * 1024  # one event (one block: its hash, block_size token ids, a salt) always fits


@dataclasses.dataclass(frozen=True)
class KVEventsConfig:
    """Where and whether the engine publishes KV cache events, who may read them and what they show
    (features/kv_events.py)."""

    enable_kv_cache_events: bool = False
    """Publish events at all."""
    publisher: PublisherName = "zmq"
    """"zmq": a ZeroMQ publisher socket; "null": record and drop (for measuring the cost)."""
    endpoint: Optional[str] = None
    """The socket's address. None: tcp://<host>:5557, bound, where host is the HTTP server's --host (127.0.0.1 for a
    library engine)."""
    bind: Optional[bool] = None
    """Bind the endpoint (true) or connect to it (false, a subscriber that binds). None: vLLM's rule, bind a wildcard
    address (tcp://*:5557), ipc:// or inproc://, connect to anything else; the default endpoint is always bound."""
    topic: str = ""
    """The first frame of every message; subscribers filter on its prefix."""
    hwm: Optional[int] = None
    """ZeroMQ's send high-water mark: messages queued per subscriber. None: max_queue_bytes // max_message_bytes,
    so that a stalled subscriber pins at most max_queue_bytes; a larger one is refused."""
    event_layout: EventLayout = "map"
    """"map" sends each event as a map tagged by its type (vLLM today); "array" as the positional array older vLLM
    sent, for subscribers that decode only that."""
    curve_secret_key_file: Optional[str] = None
    """CURVE: the publisher's certificate (a `name.key_secret` file of zmq.auth.create_certificates). With it, only
    clients whose public key is in curve_authorized_keys_dir connect, and the events are encrypted."""
    curve_authorized_keys_dir: Optional[str] = None
    """CURVE: a directory of the subscribers' public certificates (`name.key` files); required with the secret key."""
    redact: bool = False
    """Send no token ids (BlockStored's token_ids is empty) and, for a cache salt, an HMAC-SHA256 of it
    ("hmac-sha256:<hex>") instead of the salt. Block hashes are sent as they are (they are digests already)."""
    redaction_key_file: Optional[str] = None
    """The HMAC key for redact (the file's bytes, at least 16), so that replicas publish the same digest of a salt.
    None: a random key per process."""
    max_message_bytes: int = 256 * 1024
    """The largest message sent (a step's batch is split into several under it)."""
    max_queue_bytes: int = 64 * 1024 * 1024
    """The bound on the publisher's own queue (batches the socket has not taken yet; the oldest are dropped past it)
    and, through hwm, on what ZeroMQ holds for one subscriber."""
    max_subscriptions: int = 1024
    """Distinct topics subscribed to, over all subscribers; past it every connection is dropped (a subscription
    flood) and subscribers reconnect."""
    slow_subscriber: SlowSubscriberPolicy = "drop"
    """A subscriber whose queue is full: "drop" (vLLM's behaviour) loses the messages it cannot take, the others get
    them; "hold" stops sending to everyone (held in the publisher's bounded queue) until it reads, for one router
    that must not miss a burst."""

    def __post_init__(self) -> None:
        def refuse(name: str, expected: str) -> None:
            raise ValueError(f"kv_events_config: {name} must be {expected}, got {getattr(self, name)!r}")

        if not isinstance(self.enable_kv_cache_events, bool):
            refuse("enable_kv_cache_events", "a bool")
        if self.publisher not in _PUBLISHERS:
            refuse("publisher", f"one of {_PUBLISHERS}")
        if self.endpoint is not None and (not isinstance(self.endpoint, str) or "://" not in self.endpoint):
            refuse("endpoint", "a ZeroMQ address such as tcp://127.0.0.1:5557")
        for name in ("bind", "redact"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                refuse(name, "a bool")
        if not isinstance(self.topic, str):
            refuse("topic", "a string")
        if self.event_layout not in _LAYOUTS:
            refuse("event_layout", f"one of {_LAYOUTS}")
        if self.slow_subscriber not in _SLOW_SUBSCRIBER_POLICIES:
            refuse("slow_subscriber", f"one of {_SLOW_SUBSCRIBER_POLICIES}")
        for name in ("curve_secret_key_file", "curve_authorized_keys_dir", "redaction_key_file"):
            path = getattr(self, name)
            if path is not None and (not isinstance(path, str) or not path):
                refuse(name, "a path")
        if (self.curve_secret_key_file is None) != (self.curve_authorized_keys_dir is None):
            raise ValueError("kv_events_config: curve_secret_key_file and curve_authorized_keys_dir go together "
                             "(the publisher's secret key and the subscribers' public keys)")
        if self.curve_secret_key_file is not None and self.resolved_endpoint().startswith("inproc://"):
            refuse("endpoint", "tcp:// or ipc:// with CURVE (inproc:// has no authentication)")
        if self.redaction_key_file is not None and not self.redact:
            raise ValueError("kv_events_config: redaction_key_file is set but redact is not true")
        for name, least in (("max_message_bytes", _MIN_MESSAGE_BYTES), ("max_queue_bytes", None),
                            ("max_subscriptions", 1)):
            value = getattr(self, name)
            least = least if least is not None else self.max_message_bytes
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                refuse(name, f"an int >= {least}")
        if self.hwm is not None:
            if not isinstance(self.hwm, int) or isinstance(self.hwm, bool) or self.hwm < 1:
                refuse("hwm", "an int >= 1")
            if self.hwm * self.max_message_bytes > self.max_queue_bytes:
                refuse("hwm", f"at most max_queue_bytes // max_message_bytes = {self.send_hwm()} (a stalled "
                              "subscriber would pin more than max_queue_bytes)")

    def send_hwm(self) -> int:
        """The socket's SNDHWM: hwm, or as many of the largest messages as max_queue_bytes holds."""
        return self.hwm if self.hwm is not None else self.max_queue_bytes // self.max_message_bytes

    def resolved_endpoint(self) -> str:
        """The address the socket uses (the default one on loopback)."""
        return self.endpoint if self.endpoint is not None else tcp_endpoint(LOOPBACK_HOST)

    def binds(self) -> bool:
        """Whether the socket binds its endpoint rather than connects to it."""
        if self.bind is not None:
            return self.bind
        endpoint = self.resolved_endpoint()
        # vLLM's convention: bind a stable address (a wildcard host, ipc, inproc), connect to anything else.
        return (self.endpoint is None or "*" in endpoint or "::" in endpoint
                or endpoint.startswith(("ipc://", "inproc://")))

    def leaves_loopback(self) -> bool:
        """Whether the events can reach another machine (a tcp address that is not a loopback one)."""
        endpoint = self.resolved_endpoint()
        if not endpoint.startswith("tcp://"):
            return False  # ipc:// and inproc:// stay on this machine
        host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
        if host in ("localhost", "lo"):
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:
            return True  # "*", a name, an interface: assume it reaches out


def tcp_endpoint(host: str, port: int = DEFAULT_PORT) -> str:
    """The ZeroMQ address of `host` (an HTTP --host: an address, a name, "0.0.0.0", "::" or "") and `port`."""
    if host in ("", "0.0.0.0"):
        host = "*"
    elif ":" in host:
        host = "*" if host == "::" else f"[{host}]"
    return f"tcp://{host}:{port}"


def kv_events_on_http_host(text: Optional[str], host: str) -> Optional[str]:
    """A --kv-events-config with no endpoint bound on the HTTP server's host (`serve` calls this with its --host);
    one that names an endpoint, or no config, is returned as it is."""
    if text is None:
        return None
    value = _parse_object(text)
    if "endpoint" in value:
        return text
    return json.dumps({**value, "endpoint": tcp_endpoint(host), "bind": True})


def _parse_object(text: str) -> dict:
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"kv_events_config: not valid JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"kv_events_config: must be a JSON object, got {text!r}")
    return value


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """The config of a --kv-events-config JSON object; ValueError naming the problem."""
    value = _parse_object(text)
    known = {field.name for field in dataclasses.fields(KVEventsConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"kv_events_config: unsupported keys {unknown} (supported: {sorted(known)})")
    return KVEventsConfig(**value)
