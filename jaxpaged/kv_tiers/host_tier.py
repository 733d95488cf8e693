"""HostTier: KV blocks in host memory, least recently used first out, bounded in bytes."""

import collections
from typing import Optional

import numpy as np

from jaxpaged.core.kv_events import MEDIUM_HOST
from jaxpaged.core.tier_events import TierEventRecorder

from .tier_stats import TierStats


class HostTier:
    """One shard's blocks in host RAM, keyed by chain hash (the fingerprint is fixed per tier: see tiers.py)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        """The most bytes of block payloads held at once."""
        self.stats = TierStats(capacity_bytes=capacity_bytes)
        """Counters (bytes_used and num_blocks kept current)."""
        self._blocks: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()
        self.events: Optional[TierEventRecorder] = None
        """When KV events are on: told of every block this tier takes in or evicts."""

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def get(self, key: bytes) -> Optional[np.ndarray]:
        """The block's payload (now the most recently used), or None."""
        payload = self._blocks.get(key)
        if payload is not None:
            self._blocks.move_to_end(key)
        return payload

    def touch(self, key: bytes) -> None:
        """Mark the block most recently used (the device evicted it again: it is still hot)."""
        if key in self._blocks:
            self._blocks.move_to_end(key)

    def put(self, key: bytes, payload: np.ndarray) -> list[tuple[bytes, np.ndarray]]:
        """Hold the block; returns the least recently used blocks pushed out to make room (for the disk tier).

        A payload bigger than the whole tier is not held and comes straight back.
        """
        if payload.nbytes > self.capacity_bytes:
            return [(key, payload)]
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return []
        evicted = []
        while self.stats.bytes_used + payload.nbytes > self.capacity_bytes:
            old_key, old_payload = self._blocks.popitem(last=False)
            self.stats.bytes_used -= old_payload.nbytes
            evicted.append((old_key, old_payload))
            if self.events is not None:
                self.events.removed(MEDIUM_HOST, old_key)
        self._blocks[key] = payload
        self.stats.bytes_used += payload.nbytes
        self.stats.bytes_in += payload.nbytes
        self.stats.num_blocks = len(self._blocks)
        if self.events is not None:
            self.events.stored(MEDIUM_HOST, key)
        return evicted

    def keys(self) -> list[bytes]:
        """Every key, least recently used first."""
        return list(self._blocks)

    def items(self) -> list[tuple[bytes, np.ndarray]]:
        """Every (key, payload), least recently used first."""
        return list(self._blocks.items())

    def clear(self) -> None:
        """Drop every block (a prefix-cache reset)."""
        self._blocks.clear()
        self.stats.bytes_used = self.stats.num_blocks = 0
