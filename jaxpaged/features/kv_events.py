"""KV cache events as an engine feature: every rank's prefix cache records what it stores, evicts and clears
(core/kv_events.py), and after each step the feature publishes the new events as vLLM does, so a KV-aware router
written for vLLM follows jaxpaged's caches too.

The wire format is vLLM's (vllm/distributed/kv_events.py, its msgspec structs in their array layout): a ZeroMQ PUB
message of three frames, (topic, sequence number as 8 big-endian bytes, msgpack payload), the payload an EventBatch
[ts, [event, ...], data_parallel_rank] and each event a list that starts with its type:
["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys],
["BlockRemoved", block_hashes, medium] or ["AllBlocksCleared"]. Block hashes are jaxpaged's 32-byte chain hashes
(msgpack bin). One socket carries every data-parallel rank, each batch naming its rank (vLLM opens one per rank).

pyzmq and msgpack are imported only when the events are on.
"""

import logging
import time
from typing import TYPE_CHECKING, Any, Optional, cast

from jaxpaged.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent, KVEventLog
from jaxpaged.features.base import EngineFeature
from jaxpaged.kv_events_config import KVEventsConfig

if TYPE_CHECKING:
    from jaxpaged.engine.ranks import DataParallelRanks

logger = logging.getLogger(__name__)


def event_fields(event: KVCacheEvent) -> list[Any]:
    """One event as vLLM's msgspec array layout encodes it: its type's name, then its fields in order (a trailing
    field at its default left out, as msgspec's omit_defaults does)."""
    if isinstance(event, BlockStored):
        fields: list[Any] = ["BlockStored", list(event.block_hashes), event.parent_block_hash, list(event.token_ids),
                             event.block_size, None, event.medium, None]
        if any(keys is not None for keys in event.extra_keys):
            fields.append([list(keys) if keys is not None else None for keys in event.extra_keys])
        return fields
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), event.medium]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV cache event: {event!r}")


def encode_batch(events: list[KVCacheEvent], data_parallel_rank: int, ts: Optional[float] = None) -> bytes:
    """An EventBatch's msgpack payload."""
    import msgpack

    batch = [time.time() if ts is None else ts, [event_fields(event) for event in events], data_parallel_rank]
    return cast(bytes, msgpack.packb(batch, use_bin_type=True))  # None only for a Packer that does not reset


class ZmqEventPublisher:
    """A ZeroMQ PUB socket sending each batch as (topic, sequence number, payload)."""

    def __init__(self, config: KVEventsConfig) -> None:
        import zmq

        self._zmq = zmq
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.set_hwm(config.hwm)
        endpoint = config.endpoint
        # vLLM's convention: bind a stable address (a wildcard host, ipc, inproc), connect to anything else.
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        self._topic = config.topic.encode()
        self._sequence = 0
        self.num_dropped = 0
        """Batches a full send queue (a slow or absent subscriber past the high-water mark) dropped."""

    def publish(self, payload: bytes) -> None:
        # NOTE: never blocks the engine: a PUB socket drops what its queue cannot hold.
        try:
            self._socket.send_multipart((self._topic, self._sequence.to_bytes(8, "big"), payload),
                                        flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            self.num_dropped += 1
        self._sequence += 1

    def close(self) -> None:
        self._socket.close(linger=1000)


class KVEventsFeature(EngineFeature):
    """Records each rank's cache events and publishes them after every step (and after a prefix-cache reset)."""

    def __init__(self, config: KVEventsConfig) -> None:
        self._publisher = ZmqEventPublisher(config) if config.publisher == "zmq" else None
        self._logs: list[KVEventLog] = []

    def after_warmup(self, ranks: "DataParallelRanks") -> None:
        self._logs = [scheduler.kv_cache_manager.record_kv_events() for scheduler in ranks.schedulers]

    def after_step(self, ranks: "DataParallelRanks") -> None:
        for dp_rank, log in enumerate(self._logs):
            events = log.take()
            if events and self._publisher is not None:
                self._publisher.publish(encode_batch(events, dp_rank))

    def close(self, ranks: "DataParallelRanks") -> None:
        self.after_step(ranks)
        if self._publisher is not None:
            if self._publisher.num_dropped:
                logger.warning("KV events: %d batches were dropped (no subscriber kept up)",
                               self._publisher.num_dropped)
            self._publisher.close()
