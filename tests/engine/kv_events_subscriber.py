"""A KV-aware router's view of an engine's caches, kept only from the published KV events (vLLM's wire format,
events as maps or as positional arrays): per medium ("GPU", and with the KV tiers "CPU" and "DISK") and data-parallel
rank, the set of cached chain hashes. Each event is checked on the way in."""

import time

import msgpack
import zmq

from jaxpaged.core.hashing import hash_block_tokens

# vLLM's field order, for events sent as positional arrays (the type's name first).
POSITIONAL_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                     "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                                     "kv_cache_spec_sliding_window"),
                     "BlockRemoved": ("block_hashes", "medium", "group_idx"), "AllBlocksCleared": ()}


def as_map(event) -> dict:
    """An event as a map tagged by "type", whichever layout it came in."""
    if isinstance(event, dict):
        return event
    kind, *values = event
    assert len(values) <= len(POSITIONAL_FIELDS[kind]), event
    return {"type": kind, **dict(zip(POSITIONAL_FIELDS[kind], values))}


class Subscriber:
    """Subscribes to `topic` at `endpoint` and applies every event it receives to per-rank cached sets."""

    def __init__(self, endpoint: str, topic: str, block_size: int) -> None:
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.socket.connect(endpoint)
        self.topic, self.block_size = topic.encode(), block_size
        self.held: dict[str, dict] = {"GPU": {}, "CPU": {}, "DISK": {}}
        """Per medium, per rank (per (rank, group_idx) for events of KV cache groups): the chain hashes the events say
        it holds."""
        self.cached = self.held["GPU"]
        """Per rank, the device's set."""
        self.ever_stored: set[bytes] = set()
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.counts_by_medium: dict[tuple[str, str], int] = {}
        """(event type, medium) -> how many arrived."""
        self.events: list[dict] = []
        self.next_sequence = 0

    def drain(self) -> None:
        """Apply every message that arrives until none has for 200 ms."""
        while self.socket.poll(200):
            topic, sequence, payload = self.socket.recv_multipart()
            assert topic == self.topic
            assert int.from_bytes(sequence, "big") == self.next_sequence  # nothing lost, nothing reordered
            self.next_sequence += 1
            ts, events, data_parallel_rank = msgpack.unpackb(payload)
            assert abs(ts - time.time()) < 600
            for event in events:
                self.apply(data_parallel_rank, event)

    def apply(self, rank: int, event) -> None:
        event = as_map(event)
        self.events.append(event)
        kind = event["type"]
        self.counts[kind] += 1
        if kind == "AllBlocksCleared":
            assert event == {"type": "AllBlocksCleared"}
            for by_rank in self.held.values():  # every medium; what survives (the disk) is announced again
                for key in list(by_rank):
                    if key == rank or (isinstance(key, tuple) and key[0] == rank):
                        by_rank[key] = set()
                by_rank[rank] = set()
            return
        medium = event["medium"]
        self.counts_by_medium[kind, medium] = self.counts_by_medium.get((kind, medium), 0) + 1
        group = event.get("group_idx")
        cached = self.held[medium].setdefault(rank if group is None else (rank, group), set())
        if kind == "BlockStored":
            block_hashes, parent, token_ids = event["block_hashes"], event["parent_block_hash"], event["token_ids"]
            block_size = event["block_size"]
            extra_keys = event.get("extra_keys") or [None] * len(block_hashes)
            assert (block_size, event["lora_id"], event["lora_name"]) == (self.block_size, None, None)
            assert parent is None or parent in self.ever_stored  # chains are announced from their start
            for index, block_hash in enumerate(block_hashes):
                tokens = token_ids[index * block_size:(index + 1) * block_size]
                block_keys = extra_keys[index]
                keys = tuple(block_keys) if block_keys is not None else ()
                if tokens or medium != "DISK":  # only a disk file from an earlier run is announced without tokens
                    assert hash_block_tokens(parent, tokens, keys) == block_hash  # a router can recompute it
                parent = block_hash
                cached.add(block_hash)
                self.ever_stored.add(block_hash)
        else:
            assert kind == "BlockRemoved"
            for block_hash in event["block_hashes"]:
                cached.remove(block_hash)  # only blocks it was told about are removed

    def close(self) -> None:
        self.socket.close(linger=0)
