"""KVTiers under churn: random stores, fetches and touches against small host and disk bounds. Every fetch returns
exactly the stored bytes or a miss, no tier ever holds more than its bound (checked on the real files too), and the
KV events the tiers record name exactly what each holds."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxpaged.core.kv_events import BlockRemoved, BlockStored, KVEventLog
from jaxpaged.core.tier_events import TierEventRecorder
from jaxpaged.kv_tiers.host_tier import HostTier
from jaxpaged.kv_tiers.tiers import KVTiers

SHARD_SHAPE = (2, 16, 2, 8)  # one shard of one block: [layers, block_size, 2 * kv_heads / tp, head_dim]
SHARD_BYTES = int(np.prod(SHARD_SHAPE)) * 4


def shard_payload(key_number: int, shard: int) -> np.ndarray:
    return np.full(SHARD_SHAPE, key_number * 10 + shard, np.float32)


def key(n: int) -> bytes:
    return n.to_bytes(32, "big")


operations = st.lists(st.tuples(st.sampled_from(["store", "fetch", "touch"]), st.integers(0, 11)),
                      min_size=1, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, num_shards=st.sampled_from([1, 2]), host_blocks=st.integers(0, 4),
       disk_blocks=st.integers(0, 5))
def test_churn_keeps_bytes_exact_and_bounds_held(tmp_path_factory, ops, num_shards, host_blocks, disk_blocks):
    directory = tmp_path_factory.mktemp("tiers") if disk_blocks else None
    if host_blocks == 0 and directory is None:
        host_blocks = 1
    # The disk bound counts whole files (header included): leave each block ~1 KiB for its header.
    tiers = KVTiers([f"{shard:032x}" for shard in range(num_shards)], host_blocks * SHARD_BYTES * num_shards,
                    None if directory is None else str(directory), disk_blocks * (SHARD_BYTES + 1024) * num_shards)
    log = KVEventLog(block_size=16)
    recorder = TierEventRecorder([log])
    tiers.record_events(recorder)
    announced: dict[str, set[bytes]] = {"CPU": set(), "DISK": set()}
    stored = set()
    for op, n in ops:
        if op == "store":
            tiers.store(key(n), [shard_payload(n, shard) for shard in range(num_shards)])
            stored.add(n)
            assert tiers.holds(key(n))  # the newest block is always somewhere (it fits either tier)
        elif op == "fetch":
            payload = tiers.fetch(key(n))
            if payload is not None:
                assert n in stored
                for shard, array in enumerate(payload.shards):
                    assert np.array_equal(array, shard_payload(n, shard))
        else:
            tiers.touch(key(n))
        stats = tiers.stats()
        for name, tier in stats.items():
            assert tier.bytes_used <= tier.capacity_bytes, name
        if directory is not None:
            on_disk = sum(path.stat().st_size for path in directory.rglob("*.kv"))
            assert on_disk == stats["disk"].bytes_used <= stats["disk"].capacity_bytes
            assert not list(directory.rglob("*.tmp"))
        recorder.flush()
        for event in log.take():
            assert isinstance(event, (BlockStored, BlockRemoved))
            (block_hash,) = event.block_hashes
            if isinstance(event, BlockStored):
                assert block_hash not in announced[event.medium]
                announced[event.medium].add(block_hash)
            else:
                announced[event.medium].remove(block_hash)
        assert {medium: announced[medium] for medium in tiers.held_hashes()} == tiers.held_hashes()


def test_host_tier_is_lru_and_pushes_out_the_oldest():
    tier = HostTier(2 * SHARD_BYTES)
    assert tier.put(key(1), shard_payload(1, 0)) == [] and tier.put(key(2), shard_payload(2, 0)) == []
    tier.touch(key(1))
    pushed = tier.put(key(3), shard_payload(3, 0))
    assert [k for k, _ in pushed] == [key(2)]
    assert key(1) in tier and key(3) in tier and tier.stats.bytes_used == 2 * SHARD_BYTES
    too_big = np.zeros((3 * SHARD_BYTES // 4,), np.float32)
    assert tier.put(key(4), too_big) == [(key(4), too_big)] and key(4) not in tier


def test_host_then_disk_then_deleted(tmp_path):
    """A block pushed out of host memory is written to disk, and a disk hit is promoted back to host."""
    tiers = KVTiers(["0" * 32], SHARD_BYTES, str(tmp_path), 10 * 2**20)
    tiers.store(key(1), [shard_payload(1, 0)])
    tiers.store(key(2), [shard_payload(2, 0)])  # pushes 1 to disk
    assert list(tmp_path.rglob("*.kv")) and tiers.stats()["disk"].num_blocks == 1
    payload = tiers.fetch(key(1))
    assert payload is not None and np.array_equal(payload.shards[0], shard_payload(1, 0))
    stats = tiers.stats()
    assert stats["disk"].hit_blocks == 1 and stats["host"].hit_blocks == 0
    assert tiers.fetch(key(1)) is not None and tiers.stats()["host"].hit_blocks == 1  # promoted: now in host
    tiers.clear_host()
    assert tiers.holds(key(1)) and tiers.stats()["host"].num_blocks == 0  # the disk tier persists


def test_tiers_need_somewhere_to_live():
    with pytest.raises(ValueError, match="kv_offload_memory"):
        KVTiers(["0" * 32], 0, None, 0)
