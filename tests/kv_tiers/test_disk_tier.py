"""DiskTier on real files: round trips, every kind of damage is a miss (and the file goes), atomic writes, the LRU
bound, a restart's index, and two tiers sharing one directory."""

import json
import os
import struct
import time

import ml_dtypes
import numpy as np
import pytest

from jaxpaged.kv_tiers.disk_tier import MAGIC, DiskTier

FINGERPRINT = "f" * 32


def block(seed: int, dtype=np.float32) -> np.ndarray:
    """One block's [layers, block_size, 2 * kv_heads, head_dim] payload."""
    return np.random.default_rng(seed).standard_normal((2, 16, 4, 8)).astype(dtype)


def key(n: int) -> bytes:
    return n.to_bytes(32, "big")


def entry_path(tier: DiskTier, k: bytes):
    return tier.directory / k.hex()[:2] / (k.hex() + ".kv")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_round_trip_keeps_bytes_dtype_and_shape(tmp_path, dtype):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    payload = block(1, dtype)
    tier.write(key(1), payload)
    got = tier.read(key(1))
    assert got is not None and got.dtype == payload.dtype and got.shape == payload.shape
    assert got.tobytes() == payload.tobytes()
    assert tier.stats.num_blocks == 1 and tier.stats.bytes_used == entry_path(tier, key(1)).stat().st_size
    assert not list(tmp_path.rglob("*.tmp"))  # the temporary file was renamed into place


def damage_flip_payload_bit(data: bytes) -> bytes:
    return data[:-7] + bytes([data[-7] ^ 0x10]) + data[-6:]


def damage_truncate(data: bytes) -> bytes:
    return data[:len(data) // 2]


def damage_empty(data: bytes) -> bytes:
    return b""


def damage_magic(data: bytes) -> bytes:
    return b"XXXXXXXX" + data[8:]


def rewrite_header(data: bytes, **changes) -> bytes:
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(data[start:start + length]) | changes
    encoded = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(encoded)) + encoded + data[start + length:]


def damage_other_fingerprint(data: bytes) -> bytes:
    return rewrite_header(data, fingerprint="0" * 32)


def damage_other_key(data: bytes) -> bytes:
    return rewrite_header(data, key=key(99).hex())


def damage_shape(data: bytes) -> bytes:
    return rewrite_header(data, shape=[2, 16, 4, 9])


def damage_header_garbage(data: bytes) -> bytes:
    return MAGIC + struct.pack("<I", 5) + b"{nope" + data[40:]


@pytest.mark.parametrize("damage", [damage_flip_payload_bit, damage_truncate, damage_empty, damage_magic,
                                    damage_other_fingerprint, damage_other_key, damage_shape, damage_header_garbage])
def test_a_damaged_entry_is_a_miss_and_is_removed(tmp_path, damage):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    tier.write(key(1), block(1))
    path = entry_path(tier, key(1))
    path.write_bytes(damage(path.read_bytes()))
    assert key(1) in tier  # the index still lists it: only a read checks the bytes
    assert tier.read(key(1)) is None
    assert not path.exists() and key(1) not in tier
    assert tier.stats.corrupt_entries == 1 and tier.stats.bytes_used == 0


def test_a_file_deleted_behind_its_back_is_a_miss(tmp_path):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    tier.write(key(1), block(1))
    entry_path(tier, key(1)).unlink()
    assert tier.read(key(1)) is None and tier.stats.bytes_used == 0 and tier.stats.corrupt_entries == 0


def test_least_recently_used_files_go_first_within_the_bound(tmp_path):
    probe = DiskTier(tmp_path / "probe", FINGERPRINT, 10 * 2**20)
    probe.write(key(0), block(0))
    size = entry_path(probe, key(0)).stat().st_size
    tier = DiskTier(tmp_path, FINGERPRINT, 3 * size)
    for n in (1, 2, 3):
        tier.write(key(n), block(n))
    assert tier.read(key(1)) is not None  # 1 is now the most recently used
    tier.write(key(4), block(4))
    assert [key(n) in tier for n in (1, 2, 3, 4)] == [True, False, True, True]
    assert not entry_path(tier, key(2)).exists()
    assert tier.stats.bytes_used == 3 * size <= tier.capacity_bytes
    tier.write(key(5), np.zeros((2, 16, 4, 1000), np.float32))  # bigger than the whole tier: not stored
    assert key(5) not in tier and tier.stats.bytes_used == 3 * size


def test_a_restart_finds_the_files_in_their_lru_order_and_within_a_smaller_bound(tmp_path):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    for n in (1, 2, 3):
        tier.write(key(n), block(n))
        os.utime(entry_path(tier, key(n)), (time.time() - 100 + n, time.time() - 100 + n))
    size = entry_path(tier, key(1)).stat().st_size
    stale = tier.directory / "ab" / ".leftover.tmp"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"partial")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    restarted = DiskTier(tmp_path, FINGERPRINT, 2 * size)  # room for two: the oldest file (1) goes
    assert [key(n) in restarted._index for n in (1, 2, 3)] == [False, True, True]
    got = restarted.read(key(3))
    assert got is not None and np.array_equal(got, block(3))
    assert not stale.exists()


def test_two_tiers_sharing_a_directory_see_each_others_whole_files(tmp_path):
    first = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    second = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    first.write(key(1), block(1))
    assert key(1) in second  # adopted on first lookup
    got = second.read(key(1))
    assert got is not None and np.array_equal(got, block(1))
    second.write(key(1), block(1))  # already known: no rewrite
    second.remove(key(1))
    assert first.read(key(1)) is None  # gone under first: a miss, not an error


def test_another_fingerprint_lives_in_another_directory(tmp_path):
    one = DiskTier(tmp_path, "1" * 32, 10 * 2**20)
    other = DiskTier(tmp_path, "2" * 32, 10 * 2**20)
    one.write(key(1), block(1))
    assert key(1) not in other and other.read(key(1)) is None
