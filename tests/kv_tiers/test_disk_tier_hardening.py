"""The disk tier against a hostile or failing filesystem (issue 43, items 10-13): filesystem errors cost the tier
and never the engine, a header may not choose a dtype or shape the pool does not use, files are the owner's only
and with a key carry a MAC a planter cannot compute, and the fingerprint tells a fine-tune from its base."""

import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest

from jaxpaged.kv_tiers import layout_fingerprint, weights_sample_digest
from jaxpaged.kv_tiers.disk_tier import MAGIC, DiskTier
from tests.kv_tiers.test_disk_tier import FINGERPRINT, block, entry_path, key, rewrite_header

SPEC = ("float32", (2, 16, 4, 8))


def test_a_file_removed_by_another_server_after_the_read_still_serves_the_bytes(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    tier.write(key(1), block(1))

    def gone(path, *args):
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "utime", gone)
    got = tier.read(key(1))
    assert got is not None and got.tobytes() == block(1).tobytes()


def test_a_deleted_directory_is_made_again_and_an_unreadable_entry_is_a_miss(tmp_path):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    tier.write(key(1), block(1))
    for path in sorted(tier.directory.rglob("*"), reverse=True):  # another process wiped the directory
        path.rmdir() if path.is_dir() else path.unlink()
    tier.directory.rmdir()
    tier.write(key(2), block(2))
    assert tier.read(key(2)) is not None and tier.read(key(1)) is None
    path = entry_path(tier, key(3))
    path.parent.mkdir(exist_ok=True)
    path.mkdir()  # a directory where the file should be: reading it is an OSError other than not-found
    assert key(3) in tier and tier.read(key(3)) is None and key(3) not in tier._index


def test_a_failing_unlink_forgets_the_entry_without_raising(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)
    tier.write(key(1), block(1))

    def read_only(self, missing_ok=False):
        raise PermissionError(str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    tier.remove(key(1))
    assert key(1) not in tier._index and tier.stats.bytes_used == 0


@pytest.mark.parametrize("changes", [{"dtype": "object"}, {"dtype": "V8"}, {"dtype": "<U2"},
                                     {"shape": [2, 16, 8, 4]}, {"shape": [1, 0, 4, 8]}, {"shape": [8] * 9}])
def test_a_header_may_not_choose_another_dtype_or_shape(tmp_path, changes):
    tier = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20, block_spec=SPEC)
    tier.write(key(1), block(1))
    path = entry_path(tier, key(1))
    path.write_bytes(rewrite_header(path.read_bytes(), **changes))  # its CRC still matches the payload
    assert tier.read(key(1)) is None and not path.exists() and tier.stats.corrupt_entries == 1


def test_a_block_of_another_shape_with_a_matching_header_is_not_read_into_this_pool(tmp_path):
    writer = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20)  # no spec: writes whatever it is given
    writer.write(key(1), np.zeros((2, 16, 4, 4), np.float32))  # self-consistent, CRC and all
    reader = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20, block_spec=SPEC)
    assert reader.read(key(1)) is None


def test_files_are_the_owner_s_only(tmp_path):
    tier = DiskTier(tmp_path / "kv", FINGERPRINT, 10 * 2**20)
    tier.write(key(1), block(1))
    path = entry_path(tier, key(1))
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    for directory in (tmp_path / "kv", tier.directory, path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) & 0o077 == 0, directory


def test_with_a_key_only_files_signed_with_it_are_read(tmp_path):
    signed = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20, block_spec=SPEC, mac_key=b"s3cret")
    signed.write(key(1), block(1))
    again = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20, block_spec=SPEC, mac_key=b"s3cret")  # a restart
    restored = again.read(key(1))
    assert restored is not None and restored.tobytes() == block(1).tobytes()
    # A planter who can write the directory: a well-formed file with a valid CRC but no MAC, or a forged one.
    planter = DiskTier(tmp_path / "elsewhere", FINGERPRINT, 10 * 2**20)
    planter.write(key(2), block(7))
    planted = entry_path(planter, key(2)).read_bytes()
    target = entry_path(signed, key(2))
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(planted)
    assert signed.read(key(2)) is None
    target.write_bytes(rewrite_header(planted, mac="0" * 64))
    assert signed.read(key(2)) is None
    other_key = DiskTier(tmp_path, FINGERPRINT, 10 * 2**20, block_spec=SPEC, mac_key=b"another")
    assert other_key.read(key(1)) is None
    assert planted.startswith(MAGIC) and struct.unpack_from("<I", planted, len(MAGIC))[0] > 0


def test_a_fine_tune_with_the_same_name_and_config_has_another_fingerprint():
    base = {"embed": np.arange(1000, dtype=np.float32).reshape(100, 10), "norm": np.ones(10, np.float32)}
    tuned = {name: value.copy() for name, value in base.items()}
    tuned["embed"][-1, -1] += 1e-3  # the last value of one tensor
    fingerprint = lambda params: layout_fingerprint("m", {"hidden_size": 10}, "float32", 16, "interleaved",
                                                    (2, 16, 4, 8), 1, 0, weights_sample_digest(params))
    assert weights_sample_digest(base) == weights_sample_digest({k: v.copy() for k, v in base.items()})
    assert fingerprint(base) != fingerprint(tuned)
