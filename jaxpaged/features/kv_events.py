"""KV cache events as an engine feature: every rank's prefix cache records what it stores, evicts and clears
(core/kv_events.py), and after each step the feature publishes the new events as vLLM does, so a KV-aware router
written for vLLM follows jaxpaged's caches too.

The wire format is vLLM's (vllm/distributed/kv_events.py, its msgspec structs): a ZeroMQ message of three
frames, (topic, sequence number as 8 big-endian bytes, msgpack payload), the payload an EventBatch
[ts, [event, ...], data_parallel_rank]. Each event is a map tagged by its type, as vLLM sends them since it moved
off positional arrays (vllm-project/vllm#42892): {"type": "BlockStored", "block_hashes", "parent_block_hash",
"token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"}, {"type": "BlockRemoved",
"block_hashes", "medium"} or {"type": "AllBlocksCleared"}; with KV cache groups, BlockStored adds "group_idx",
"kv_cache_spec_kind" and (sliding groups) "kv_cache_spec_sliding_window", BlockRemoved "group_idx", each block
hash being the chain hash within that group (vLLM's fields since its hybrid KV cache manager). "event_layout":
"array" sends the same fields as the older positional arrays (["BlockStored", block_hashes, ...]) for subscribers
that decode only those. Block hashes
are jaxpaged's 32-byte chain hashes (msgpack bin). One socket carries every data-parallel rank, each batch naming
its rank (vLLM opens one per rank).

With the KV tiers on, their blocks are published too, medium "CPU" (host memory) and "DISK"
(core/tier_events.py), in every rank's batches: the ranks share the tiers, and any of them loads from them.

Who may subscribe and what a subscriber can cost the engine: kv_events_publisher.py (CURVE, byte bounds, the
subscription flood); what it sees with "redact": kv_events_redaction.py. A step's events over max_message_bytes go
out as several batches of the same rank. pyzmq and msgpack are imported only when the events are on.
"""

import logging
import time
from typing import TYPE_CHECKING, Any, Optional, cast

from jaxpaged.core.hashing import lora_of_extra_keys
from jaxpaged.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent, KVEventLog
from jaxpaged.core.tier_events import TierEventRecorder
from jaxpaged.features.base import EngineFeature
from jaxpaged.features.kv_events_publisher import ZmqEventPublisher
from jaxpaged.features.kv_events_redaction import EventRedactor, load_redaction_key
from jaxpaged.kv_events_config import EventLayout, KVEventsConfig

if TYPE_CHECKING:
    from jaxpaged.engine.ranks import DataParallelRanks

logger = logging.getLogger(__name__)


def named_fields(event: KVCacheEvent) -> dict[str, Any]:
    """One event's fields under vLLM's names, its type first and the rest in vLLM's order (fields at their
    defaults left out, as vLLM's omit_defaults does: lora_id and lora_name are sent, as None for the base model).
    A stored event's blocks are one request's, so its first block's extra keys name the LoRA adapter of all."""
    if isinstance(event, BlockStored):
        lora_id, lora_name = lora_of_extra_keys(event.extra_keys[0] if event.extra_keys else None)
        fields = {"type": "BlockStored", "block_hashes": list(event.block_hashes),
                  "parent_block_hash": event.parent_block_hash, "token_ids": list(event.token_ids),
                  "block_size": event.block_size, "lora_id": lora_id, "medium": event.medium, "lora_name": lora_name,
                  "extra_keys": [list(keys) if keys is not None else None for keys in event.extra_keys]}
        return fields | _group_fields(event.group_idx, event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window)
    if isinstance(event, BlockRemoved):
        fields = {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": event.medium}
        return fields | _group_fields(event.group_idx)
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV cache event: {event!r}")


def _group_fields(group_idx: Optional[int], kind: Optional[str] = None,
                  window: Optional[int] = None) -> dict[str, Any]:
    """vLLM's KV cache group fields, after the others: none with one group (vLLM's omit_defaults leaves out None,
    so an "array" event ends before them); with groups the group and, for BlockStored, its kind, the window only
    for a sliding group."""
    if group_idx is None:
        return {}
    fields: dict[str, Any] = {"group_idx": group_idx}
    if kind is not None:
        fields["kv_cache_spec_kind"] = kind
        if window is not None:
            fields["kv_cache_spec_sliding_window"] = window
    return fields


def encode_batch(events: list[KVCacheEvent], data_parallel_rank: int, layout: EventLayout = "map",
                 ts: Optional[float] = None) -> bytes:
    """An EventBatch's msgpack payload, its events as maps or (layout "array") as positional arrays."""
    import msgpack

    encoded = [named_fields(event) for event in events]
    if layout == "array":
        encoded = [list(fields.values()) for fields in encoded]
    batch = [time.time() if ts is None else ts, encoded, data_parallel_rank]
    return cast(bytes, msgpack.packb(batch, use_bin_type=True))  # None only for a Packer that does not reset


def encode_batches(events: list[KVCacheEvent], data_parallel_rank: int, max_bytes: int,
                   layout: EventLayout = "map", ts: Optional[float] = None) -> list[bytes]:
    """The events as EventBatch payloads of at most max_bytes each, in order (halved until each fits; one event
    is far under any allowed bound: the config's least max_message_bytes is 64 KiB)."""
    payload = encode_batch(events, data_parallel_rank, layout, ts)
    if len(payload) <= max_bytes or len(events) <= 1:
        return [payload]
    middle = len(events) // 2
    return (encode_batches(events[:middle], data_parallel_rank, max_bytes, layout, ts)
            + encode_batches(events[middle:], data_parallel_rank, max_bytes, layout, ts))


class KVEventsFeature(EngineFeature):
    """Records each rank's cache events and publishes them after every step (and after a prefix-cache reset)."""

    def __init__(self, config: KVEventsConfig) -> None:
        self._redactor = EventRedactor(load_redaction_key(config.redaction_key_file)) if config.redact else None
        self._publisher = ZmqEventPublisher(config) if config.publisher == "zmq" else None
        self._layout: EventLayout = config.event_layout
        self._max_message_bytes = config.max_message_bytes
        self._logs: list[KVEventLog] = []
        self._tier_events: Optional[TierEventRecorder] = None

    def after_warmup(self, ranks: "DataParallelRanks") -> None:
        from jaxpaged.kv_tiers import KVTiers

        managers = [scheduler.kv_cache_manager for scheduler in ranks.schedulers]
        self._logs = [manager.record_kv_events() for manager in managers]
        tiers = managers[0].lower_tiers
        if isinstance(tiers, KVTiers):
            self._tier_events = TierEventRecorder(self._logs)
            for manager in managers:
                manager.record_tier_events(self._tier_events)
            tiers.record_events(self._tier_events)

    def after_step(self, ranks: "DataParallelRanks") -> None:
        if self._tier_events is not None:
            self._tier_events.flush()
        for dp_rank, log in enumerate(self._logs):
            events = log.take()
            if not events or self._publisher is None:
                continue
            if self._redactor is not None:
                events = [self._redactor.redact(event) for event in events]
            self._publisher.publish(encode_batches(events, dp_rank, self._max_message_bytes, self._layout))

    def close(self, ranks: "DataParallelRanks", deadline: Optional[float] = None) -> None:
        self.after_step(ranks)
        if self._publisher is not None:
            if self._publisher.num_dropped:
                logger.warning("KV events: %d messages were dropped (a subscriber did not keep up)",
                               self._publisher.num_dropped)
            self._publisher.close()
