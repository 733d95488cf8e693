"""What the grouped KV cache manager (kv_cache_groups.py) keeps of the KV tiers below the device pool.

Each group's blocks go down to the tiers and come back under the group's key (kv_group_keys.py), so one group's entry
never serves another. A hit that continues below the device follows the groups' rule (kv_group_hits.py); its blocks
are read and checked before the request's blocks are allocated (a block that is gone or damaged leaves the
device's hit alone, as a sliding group cannot shorten a hit without the blocks of an earlier window), then loaded
into freshly allocated blocks before the step that reads them.

Which sliding blocks are worth offloading: a sliding group gives a request's blocks back as its window moves past
them. Those stay cached on the device, but below it they would cost as many bytes as a full group's while a later
hit reads only a window of them. They are offloaded only when the window of the prompt's end (where a repeated or
continued prompt hits) reads them; a hit at an earlier point of a long shared prefix then finds the sliding group's
blocks on the device or recomputes. The blocks a request still holds when it finishes (the window of its end, where
a multi-turn chat continues) are offloaded like any other.
"""

import dataclasses
from collections.abc import Sequence
from typing import Optional

from .hashing import BlockHash
from .lower_tiers import LowerTiers


@dataclasses.dataclass(frozen=True, slots=True)
class TierLoad:
    """One block a hit reads from a lower tier."""

    group: int
    block_index: int
    key: BlockHash
    """The group's key of the block (kv_group_keys.group_key)."""
    payload: object
    """What LowerTiers.fetch returned, for the runner to write into the block."""


@dataclasses.dataclass(frozen=True, slots=True)
class AdmittedHit:
    """A waiting request's hit as allocated: its tokens and the loads its blocks still need."""

    num_tokens: int
    loads: tuple[TierLoad, ...]


class GroupTierLoads:
    """The reads of one admission's lower-tier blocks, the hits waiting for their loads, and the evicted sliding
    blocks not worth offloading."""

    def __init__(self, tiers: LowerTiers) -> None:
        self.tiers = tiers
        """Host and disk tiers below the device pool."""
        self.admitted: dict[str, AdmittedHit] = {}
        """Request id -> its hit as allocated, until load_lower_tier_blocks queues the loads."""
        self.unneeded: set[BlockHash] = set()
        """Keys of cached sliding blocks given back out of the window, not to be offloaded when evicted."""
        # (request id, keys, payloads or None): the last read, kept while admission retries the same hit.
        self._fetched: Optional[tuple[str, tuple[BlockHash, ...], Optional[tuple[object, ...]]]] = None

    def fetch(self, request_id: str, keys: Sequence[BlockHash]) -> Optional[tuple[object, ...]]:
        """Every key's payload, read and checked now (once per request and hit); None if any is gone or damaged."""
        keys = tuple(keys)
        if self._fetched is not None and self._fetched[:2] == (request_id, keys):
            return self._fetched[2]
        payloads = []
        for key in keys:
            payload = self.tiers.fetch(key)
            if payload is None:
                payloads = None
                break
            payloads.append(payload)
        result = tuple(payloads) if payloads is not None else None
        self._fetched = (request_id, keys, result)
        return result

    def forget_fetch(self) -> None:
        """Drop the kept read (its request is admitted: its payloads are in the pending loads now)."""
        self._fetched = None

    def worth_offloading(self, evictions: list[tuple[int, BlockHash]]) -> list[tuple[int, BlockHash]]:
        """The evictions whose blocks are worth copying down: all but the unneeded sliding blocks (forgotten now,
        as their blocks are reused)."""
        if not self.unneeded:
            return evictions
        kept = []
        for block_id, key in evictions:
            if key in self.unneeded:
                self.unneeded.discard(key)
            else:
                kept.append((block_id, key))
        return kept
