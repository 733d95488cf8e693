"""vLLM's --kv-events-config: a JSON object that turns on KV cache events and says where they are published.

{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events"}

Only the keys jaxpaged acts on are accepted (a replay socket, say, is refused rather than silently missing), plus
one of its own: "event_layout".
"""

import dataclasses
import json
from typing import Any, Literal

PublisherName = Literal["zmq", "null"]
_PUBLISHERS = ("zmq", "null")
EventLayout = Literal["map", "array"]
_LAYOUTS = ("map", "array")


@dataclasses.dataclass(frozen=True)
class KVEventsConfig:
    """Where and whether the engine publishes KV cache events (features/kv_events.py)."""

    enable_kv_cache_events: bool = False
    """Publish events at all."""
    publisher: PublisherName = "zmq"
    """"zmq": a ZeroMQ PUB socket; "null": record and drop (for measuring the cost)."""
    endpoint: str = "tcp://*:5557"
    """The PUB socket's address: bound when it has a wildcard (tcp://*:5557) or is ipc:// / inproc://, else
    connected to (a subscriber that binds)."""
    topic: str = ""
    """The first frame of every message; subscribers filter on its prefix."""
    hwm: int = 100_000
    """ZeroMQ's high-water mark: messages queued for a slow subscriber before newer ones are dropped."""
    event_layout: EventLayout = "map"
    """jaxpaged's own key: "map" sends each event as a map tagged by its type (vLLM today); "array" as the
    positional array older vLLM sent, for subscribers that decode only that."""

    def __post_init__(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError(f"kv_events_config: enable_kv_cache_events must be a bool, got "
                             f"{self.enable_kv_cache_events!r}")
        if self.publisher not in _PUBLISHERS:
            raise ValueError(f"kv_events_config: publisher must be one of {_PUBLISHERS}, got {self.publisher!r}")
        if not isinstance(self.endpoint, str) or "://" not in self.endpoint:
            raise ValueError(f"kv_events_config: endpoint must be a ZeroMQ address such as tcp://*:5557, got "
                             f"{self.endpoint!r}")
        if not isinstance(self.topic, str):
            raise ValueError(f"kv_events_config: topic must be a string, got {self.topic!r}")
        if self.event_layout not in _LAYOUTS:
            raise ValueError(f"kv_events_config: event_layout must be one of {_LAYOUTS}, got {self.event_layout!r}")
        if not isinstance(self.hwm, int) or isinstance(self.hwm, bool) or self.hwm < 0:
            raise ValueError(f"kv_events_config: hwm must be an int >= 0, got {self.hwm!r}")


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """The config of a --kv-events-config JSON object; ValueError naming the problem."""
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"kv_events_config: not valid JSON ({error}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"kv_events_config: must be a JSON object, got {text!r}")
    known = {field.name for field in dataclasses.fields(KVEventsConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"kv_events_config: unsupported keys {unknown} (supported: {sorted(known)})")
    return KVEventsConfig(**value)
