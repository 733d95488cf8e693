"""The disk tier signs by default (issue 56 #6): with no key given, a generated one kept in <root>/.hmac-key (0600)
signs every file, so a payload rewritten with a recomputed CRC is a corrupt miss after a restart; a root or key file
that others could write (or read, for the key) is refused naming kv_offload_dir; JAXPAGED_KV_OFFLOAD_KEY's key
still overrides it."""

import json
import os
import stat
import struct
import zlib

import numpy as np
import pytest

from jaxpaged.kv_tiers.disk_key import KEY_FILE_NAME, load_or_create_key
from jaxpaged.kv_tiers.disk_tier import MAGIC, DiskTier
from tests.kv_tiers.test_disk_tier import FINGERPRINT, block, entry_path, key

SPEC = ("float32", (2, 16, 4, 8))
CAPACITY = 10 * 2**20


def forge_payload(data: bytes, payload: np.ndarray) -> bytes:
    """The file with its payload replaced and the header's CRC recomputed (what anyone who can write the directory
    can do without the key)."""
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(data[start:start + length])
    raw = payload.tobytes()
    header["crc32"] = zlib.crc32(raw)
    encoded = json.dumps(header, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(encoded)) + encoded + raw


def test_default_tier_generates_a_private_key_and_signs(tmp_path):
    """No key given: <root>/.hmac-key appears with mode 0600 and a 64-hex-digit key, and a restart reads the files
    back with it."""
    tier = DiskTier(tmp_path, FINGERPRINT, CAPACITY, block_spec=SPEC)
    key_file = tmp_path / KEY_FILE_NAME
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(key_file.read_text().strip()) == 64 and int(key_file.read_text(), 16) >= 0
    tier.write(key(1), block(1))
    header = entry_path(tier, key(1)).read_bytes()
    assert b'"mac": "' in header
    restarted = DiskTier(tmp_path, FINGERPRINT, CAPACITY, block_spec=SPEC)
    got = restarted.read(key(1))
    assert got is not None and got.tobytes() == block(1).tobytes()
    assert not list(tmp_path.glob("*.tmp"))  # the key's temporary name is gone


def test_payload_rewritten_with_a_recomputed_crc_is_a_corrupt_miss_after_restart(tmp_path):
    """The attack of issue 56 #6: another block's bytes under a valid CRC are refused, counted corrupt, removed."""
    tier = DiskTier(tmp_path, FINGERPRINT, CAPACITY, block_spec=SPEC)
    tier.write(key(1), block(1))
    path = entry_path(tier, key(1))
    path.write_bytes(forge_payload(path.read_bytes(), block(99)))
    restarted = DiskTier(tmp_path, FINGERPRINT, CAPACITY, block_spec=SPEC)
    assert key(1) in restarted
    assert restarted.read(key(1)) is None
    assert restarted.stats.corrupt_entries == 1 and not path.exists()


def test_files_signed_with_another_key_or_a_non_ascii_mac_are_misses(tmp_path):
    """A file from a tier with another key, or a header whose mac is not ASCII, is a miss (never an exception)."""
    other = DiskTier(tmp_path / "other", FINGERPRINT, CAPACITY, block_spec=SPEC)
    other.write(key(1), block(1))
    tier = DiskTier(tmp_path / "mine", FINGERPRINT, CAPACITY, block_spec=SPEC)
    target = entry_path(tier, key(1))
    target.parent.mkdir()
    target.write_bytes(entry_path(other, key(1)).read_bytes())
    assert tier.read(key(1)) is None and tier.stats.corrupt_entries == 1
    data = entry_path(other, key(1)).read_bytes()
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    header = json.loads(data[len(MAGIC) + 4:len(MAGIC) + 4 + length])
    header["mac"] = "\u00e9" * 64
    encoded = json.dumps(header).encode()
    target.write_bytes(MAGIC + struct.pack("<I", len(encoded)) + encoded + data[len(MAGIC) + 4 + length:])
    assert tier.read(key(1)) is None and tier.stats.corrupt_entries == 2


def test_an_explicit_key_overrides_the_generated_one(tmp_path):
    """kv_offload_key (JAXPAGED_KV_OFFLOAD_KEY) signs instead: no key file is made, and its files are not
    readable under the generated key."""
    signed = DiskTier(tmp_path, FINGERPRINT, CAPACITY, block_spec=SPEC, mac_key=b"operator-secret")
    signed.write(key(1), block(1))
    assert not (tmp_path / KEY_FILE_NAME).exists()
    assert DiskTier(tmp_path, FINGERPRINT, CAPACITY, block_spec=SPEC, mac_key=b"operator-secret").read(key(1)) \
        is not None
    assert DiskTier(tmp_path, FINGERPRINT, CAPACITY, block_spec=SPEC).read(key(1)) is None


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722, 0o1777])
def test_a_root_others_can_write_is_refused(tmp_path, mode):
    """A group- or world-writable root (sticky or not) is refused with an error naming kv_offload_dir."""
    root = tmp_path / "kv"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(ValueError, match=r"^kv_offload_dir: --kv-offload-dir .* writable by group or others"):
        DiskTier(root, FINGERPRINT, CAPACITY)
    assert not (root / KEY_FILE_NAME).exists()


def test_a_loose_fingerprint_directory_is_refused(tmp_path):
    """A fingerprint directory left writable by others (from an older run) is refused too."""
    root = tmp_path / "kv"
    (root / FINGERPRINT).mkdir(parents=True)
    os.chmod(root, 0o700)
    os.chmod(root / FINGERPRINT, 0o777)
    with pytest.raises(ValueError, match="^kv_offload_dir: "):
        DiskTier(root, FINGERPRINT, CAPACITY)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_root_owned_by_another_user_is_refused(tmp_path):
    """A root that uid 65534 owns (mode 0700: only its owner writes it) is refused: that user could plant files
    and the key."""
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(ValueError, match=r"^kv_offload_dir: --kv-offload-dir .* owned by uid 65534"):
        DiskTier(root, FINGERPRINT, CAPACITY)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_with_loose_permissions_is_refused(tmp_path, mode):
    """A key file group or others may read or write is refused, naming kv_offload_dir and the fix."""
    DiskTier(tmp_path, FINGERPRINT, CAPACITY)
    os.chmod(tmp_path / KEY_FILE_NAME, mode)
    with pytest.raises(ValueError, match=r"^kv_offload_dir: .*\.hmac-key has mode .* must be 0600"):
        DiskTier(tmp_path, FINGERPRINT, CAPACITY)


def test_a_symlinked_empty_or_foreign_key_file_is_refused(tmp_path):
    """The key file must be this user's regular file holding a key: a symlink (to a key someone else controls)
    or an empty file is refused."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("a" * 64)
    root = tmp_path / "kv"
    root.mkdir(mode=0o700)
    (root / KEY_FILE_NAME).symlink_to(elsewhere)
    with pytest.raises(ValueError, match="^kv_offload_dir: "):
        load_or_create_key(root)
    (root / KEY_FILE_NAME).unlink()
    os.close(os.open(root / KEY_FILE_NAME, os.O_CREAT | os.O_WRONLY, 0o600))
    with pytest.raises(ValueError, match="^kv_offload_dir: .* not a key"):
        load_or_create_key(root)


def test_two_engines_agree_on_one_key(tmp_path):
    """A second tier on the same root reads the first one's key (never makes its own): either reads the other's
    files."""
    first = load_or_create_key(tmp_path)
    assert load_or_create_key(tmp_path) == first
    DiskTier(tmp_path, FINGERPRINT, CAPACITY).write(key(1), block(1))
    assert DiskTier(tmp_path, FINGERPRINT, CAPACITY).read(key(1)) is not None
