"""KVTiers: the host-memory and disk tiers below the device pool, for every tensor-parallel shard.

Device -> host -> disk, each least recently used first out and bounded in bytes:
- the device pool evicts a cached block: the runner copies its K/V down into host memory (one batched gather
  per step, each device's shard transferred on its own); a block a tier already holds is only touched;
- the host tier pushes its oldest blocks out to disk (when a directory is set), the disk tier deletes its oldest;
- a prefix lookup that runs out of device blocks goes on through the tiers (holds()); admission fetches the
  blocks (fetch(): host arrays, or disk files read and checked, then promoted to host) and the runner loads them
  into fresh device blocks before the step.

The tiers are inclusive: loading a block leaves it where it was, so evicting it again costs no copy. One KVTiers
serves every data-parallel rank: ranks with the same layout can load each other's blocks. Each shard of a
tensor-parallel split has its own host and disk tier under its own fingerprint (its directory on disk); a block
counts as held only when every shard holds it.
"""

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Optional

import numpy as np

from jaxpaged.core.kv_events import MEDIUM_DISK, MEDIUM_HOST
from jaxpaged.core.kv_group_keys import split_group_key
from jaxpaged.core.tier_events import TierEventRecorder

from .disk_tier import BlockSpec, DiskTier
from .host_tier import HostTier
from .tier_stats import TierStats

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class BlockPayload:
    """One block's K/V for the runner to load: per tensor-parallel shard, an array of [layers, ...] (the block
    axis dropped)."""

    shards: tuple[np.ndarray, ...]


@dataclasses.dataclass
class _ShardTiers:
    host: Optional[HostTier]
    disk: Optional[DiskTier]

    def holds(self, key: bytes) -> bool:
        return (self.host is not None and key in self.host) or (self.disk is not None and key in self.disk)

    def put(self, key: bytes, payload: np.ndarray) -> None:
        """Into host memory; what that pushes out (or all, without a host tier) goes to disk."""
        spilled = self.host.put(key, payload) if self.host is not None else [(key, payload)]
        if self.disk is not None:
            for spilled_key, spilled_payload in spilled:
                self.disk.write(spilled_key, spilled_payload)


class KVTiers:
    """Host and disk tiers for the shards of one KV layout (see the module docstring); implements LowerTiers."""

    def __init__(self, fingerprints: Sequence[str], host_bytes: int = 0, disk_directory: Optional[str] = None,
                 disk_bytes: int = 0, block_spec: Optional[BlockSpec] = None,
                 disk_mac_key: Optional[bytes] = None) -> None:
        """fingerprints: one per tensor-parallel shard (fingerprint.layout_fingerprint); the byte bounds are for
        all shards together; block_spec: every shard's payload (dtype name, shape), which the disk tier checks on
        read; disk_mac_key: signs and checks every disk file (disk_tier.py)."""
        if not fingerprints:
            raise ValueError("fingerprints: one per tensor-parallel shard, got none")
        if host_bytes <= 0 and disk_directory is None:
            raise ValueError("kv_offload_memory: a KV tier needs host memory or a disk directory (kv_offload_dir)")
        num_shards = len(fingerprints)
        self.fingerprints = tuple(fingerprints)
        self._shards = [
            _ShardTiers(HostTier(host_bytes // num_shards) if host_bytes > 0 else None,
                        DiskTier(disk_directory, fp, disk_bytes // num_shards, block_spec, disk_mac_key)
                        if disk_directory is not None else None)
            for fp in fingerprints]
        self._hit_blocks = {"host": 0, "disk": 0}
        self.hit_chain_blocks = {"host": 0, "disk": 0}
        """Per tier, the blocks served that stand for their chain position: every block without KV cache groups;
        with groups only the first group's (a hit's tokens count once, not once per group: hit_tokens)."""
        self._events: Optional[TierEventRecorder] = None
        self.bytes_offloaded = 0
        """Bytes the device pools handed down (store() and persist()), over all shards (cumulative)."""
        self.bytes_loaded = 0
        """Bytes fetch() handed up towards the device, over all shards (cumulative)."""
        disk = self._shards[0].disk
        if disk is not None and disk.stats.num_blocks:
            logger.info("KV disk tier: %d blocks (%.1f MiB) from earlier runs in %s", disk.stats.num_blocks,
                        disk.stats.bytes_used / 2**20, os.fspath(disk.directory))

    @property
    def num_shards(self) -> int:
        """Tensor-parallel shards each block is stored as."""
        return len(self._shards)

    # ---- LowerTiers ----

    def holds(self, block_hash: bytes) -> bool:
        """Whether every shard of the block is in host memory or on disk (index lookups, no reads)."""
        return all(shard.holds(block_hash) for shard in self._shards)

    def touch(self, block_hash: bytes) -> None:
        """Mark the block recently used in host memory (the device evicted it again)."""
        for shard in self._shards:
            if shard.host is not None:
                shard.host.touch(block_hash)

    def fetch(self, block_hash: bytes) -> Optional[BlockPayload]:
        """Every shard of the block, from host memory or else from disk (checked, then promoted to host); None
        if a shard is missing or damaged."""
        payloads = []
        from_disk = False
        for shard in self._shards:
            payload = shard.host.get(block_hash) if shard.host is not None else None
            if payload is None and shard.disk is not None:
                payload = shard.disk.read(block_hash)
                if payload is not None and shard.host is not None:
                    shard.put(block_hash, payload)
                from_disk = True
            if payload is None:
                return None
            payloads.append(payload)
        tier = "disk" if from_disk else "host"
        self._hit_blocks[tier] += 1
        if split_group_key(block_hash)[1] in (None, 0):
            self.hit_chain_blocks[tier] += 1
        self.bytes_loaded += sum(payload.nbytes for payload in payloads)
        if tier == "host":
            for shard, payload in zip(self._shards, payloads):
                assert shard.host is not None
                shard.host.stats.bytes_out += payload.nbytes
        return BlockPayload(tuple(payloads))

    # ---- from the runner ----

    def store(self, block_hash: bytes, shards: Sequence[np.ndarray]) -> None:
        """Take a block the device evicted: shards[i] is shard i's [layers, ...] array (kept, not copied)."""
        if len(shards) != len(self._shards):
            raise ValueError(f"shards: expected {len(self._shards)} (one per tensor-parallel shard), got {len(shards)}")
        for shard, payload in zip(self._shards, shards):
            shard.put(block_hash, payload)
        self.bytes_offloaded += sum(payload.nbytes for payload in shards)

    @property
    def has_disk(self) -> bool:
        """Whether a disk tier is on."""
        return self._shards[0].disk is not None

    def on_disk(self, block_hash: bytes) -> bool:
        """Whether every shard of the block is on disk."""
        return all(shard.disk is not None and block_hash in shard.disk for shard in self._shards)

    def persist(self, block_hash: bytes, shards: Sequence[np.ndarray]) -> None:
        """Write a block straight to disk (shutdown: the device's cached blocks), past host memory."""
        for shard, payload in zip(self._shards, shards, strict=True):
            if shard.disk is not None:
                shard.disk.write(block_hash, payload)
        self.bytes_offloaded += sum(payload.nbytes for payload in shards)

    def flush_host_to_disk(self, deadline: Optional[float] = None) -> tuple[int, int]:
        """Write every host block that is not on disk yet, least recently used first (so a full disk keeps the
        most recent), until `deadline` (time.monotonic(); None: no bound); returns how many blocks were written and
        how many were left out."""
        written = left = 0
        for shard in self._shards:
            if shard.host is None or shard.disk is None:
                continue
            for key, payload in shard.host.items():
                if key in shard.disk:
                    continue
                if deadline is not None and time.monotonic() >= deadline:
                    left += 1
                    continue
                shard.disk.write(key, payload)
                written += 1
        return written // len(self._shards), -(-left // len(self._shards))

    def clear_host(self) -> None:
        """Drop the host tier (a prefix-cache reset); the disk tier persists by design."""
        for shard in self._shards:
            if shard.host is not None:
                shard.host.clear()
        if self._events is not None:
            self._events.cleared(MEDIUM_HOST)

    def record_events(self, recorder: TierEventRecorder) -> None:
        """Tell `recorder` of every block the tiers take in or drop from now on, and of what the disk holds already
        (files from earlier runs). NOTE: shard 0 speaks for every tensor-parallel shard: the shards take in and evict
        the same blocks in the same order, and differ only where one shard's disk fails a write or a read."""
        self._events = recorder
        host, disk = self._shards[0].host, self._shards[0].disk
        if host is not None:
            host.events = recorder
            for key in host.keys():
                recorder.stored(MEDIUM_HOST, key)
        if disk is not None:
            disk.events = recorder
            for key in disk.keys():
                recorder.stored(MEDIUM_DISK, key)

    def held_hashes(self) -> dict[str, set[bytes]]:
        """Per medium ("CPU" for host memory, "DISK"), the chain hashes every shard holds there (a read-only view
        for checks: KV events name the same sets)."""
        held = {}
        for medium, name in ((MEDIUM_HOST, "host"), (MEDIUM_DISK, "disk")):
            tiers = [getattr(shard, name) for shard in self._shards]
            if all(tier is not None for tier in tiers):
                held[medium] = set.intersection(*(set(tier.keys()) for tier in tiers))
        return held

    def stats(self) -> dict[str, TierStats]:
        """Per tier ("host", "disk" when on): counters and gauges summed over the shards."""
        totals: dict[str, TierStats] = {}
        for name in ("host", "disk"):
            tiers = [getattr(shard, name) for shard in self._shards if getattr(shard, name) is not None]
            if not tiers:
                continue
            total = TierStats(hit_blocks=self._hit_blocks[name])
            for tier in tiers:
                for field in ("bytes_in", "bytes_out", "bytes_used", "capacity_bytes", "corrupt_entries"):
                    setattr(total, field, getattr(total, field) + getattr(tier.stats, field))
            total.num_blocks = tiers[0].stats.num_blocks
            totals[name] = total
        return totals
