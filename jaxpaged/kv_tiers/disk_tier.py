"""DiskTier: KV blocks as files in a local directory, bounded in bytes, checked on every read, kept across restarts.

Layout: <root>/<fingerprint>/<first two hex digits of the chain hash>/<chain hash hex>.kv, one block per file:

    b"JPKVBLK1" | uint32 header length | JSON header | payload bytes

The header names the fingerprint, the chain hash, the payload's dtype and shape, its CRC-32 and an HMAC-SHA256 of
the other fields and the payload. The key is kv_offload_key when given, else the one kept in <root>/.hmac-key
(generated once, mode 0600: disk_key.py), so every file is signed: a file planted or rewritten by anyone without
the key (a CRC they could recompute) is refused. A read that finds anything amiss (short file, wrong magic, fields,
a dtype or shape the pool does not use, checksum or MAC) removes the file and is a miss counted as corrupt: a
corrupted or planted entry costs a recompute, never wrong K/V. The root and fingerprint directories must be this
user's and not writable by group or others (refused otherwise, naming kv_offload_dir); directories are made 0700
and files 0600 (K/V is every tenant's prompt; the MAC gives integrity, not confidentiality). Filesystem errors
(another server removed a file or the directory, a full or read-only disk, permissions) cost the tier, never the
engine. Writes go to a temporary file in the same directory and are renamed into place (os.replace is atomic), so
two engines sharing a directory only ever see whole files; the last writer of a chain hash wins, with the same
bytes.

Eviction is least recently used: the index starts from the files' modification times (a read touches them), so a
restarted engine keeps the order. Each engine enforces the bound on what it knows of (files written by another
engine since it started are adopted when first looked up).
"""

import collections
import hashlib
import hmac
import json
import logging
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Optional

import jax.numpy as jnp
import numpy as np

from jaxpaged.atomic_file import TEMPORARY_SUFFIX, write_atomically
from jaxpaged.core.kv_events import MEDIUM_DISK
from jaxpaged.core.tier_events import TierEventRecorder

from .disk_key import check_private_directory, load_or_create_key
from .tier_stats import TierStats

logger = logging.getLogger(__name__)

MAGIC = b"JPKVBLK1"
_HEADER_LENGTH = struct.Struct("<I")
SUFFIX = ".kv"
STALE_TEMP_SECONDS = 600.0
"""A temporary file this old is left over from a crashed writer, and is removed at start-up."""
PAYLOAD_DTYPES = frozenset({"float32", "bfloat16", "float16", "uint32", "int8", "uint8", "float8_e4m3fn",
                            "float8_e5m2"})
"""The dtypes a KV pool is stored in; a header naming any other (object, a structured dtype) is damage."""
MAX_PAYLOAD_DIMS = 8
BlockSpec = tuple[str, tuple[int, ...]]
"""(dtype name, shape) of one block's payload, when the tier's owner knows it: a header must name exactly these."""


class DiskTier:
    """One shard's blocks on disk under one fingerprint."""

    def __init__(self, root: os.PathLike | str, fingerprint: str, capacity_bytes: int,
                 block_spec: Optional[BlockSpec] = None, mac_key: Optional[bytes] = None) -> None:
        """`block_spec`: the payload every block has (checked on read); `mac_key`: the secret that signs every
        file (files without its MAC are not read), by default the one in <root>/.hmac-key (made if absent).
        ValueError naming kv_offload_dir for a directory or key file others could write (disk_key.py)."""
        self.directory = Path(root) / fingerprint
        """Where this fingerprint's files live."""
        self.fingerprint = fingerprint
        self.capacity_bytes = capacity_bytes
        """The most bytes of files this engine keeps here."""
        self.block_spec = block_spec
        self.stats = TierStats(capacity_bytes=capacity_bytes)
        self._index: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # key -> file bytes, LRU first
        self.events: Optional[TierEventRecorder] = None
        """When KV events are on: told of every file this tier adopts or forgets (those found at start-up are
        announced when it is attached: see KVTiers.record_events)."""
        Path(root).mkdir(mode=0o700, parents=True, exist_ok=True)
        check_private_directory(Path(root))
        self.directory.mkdir(mode=0o700, exist_ok=True)
        check_private_directory(self.directory)
        self._mac_key = mac_key if mac_key is not None else load_or_create_key(Path(root))
        self._scan()

    def __contains__(self, key: bytes) -> bool:
        if key in self._index:
            return True
        try:  # another engine on the same directory may have written it since this one started
            size = self._path(key).stat().st_size
        except FileNotFoundError:
            return False
        self._adopt(key, size)
        return True

    def read(self, key: bytes) -> Optional[np.ndarray]:
        """The block's payload, verified; None when absent or damaged (a damaged file is removed)."""
        path = self._path(key)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            self._forget(key)
            return None
        except OSError as error:  # permissions, a directory in its place, an I/O error: a miss
            logger.warning("KV disk tier: could not read %s: %s", path, error)
            self._forget(key)
            return None
        payload = self._decode(key, data)
        if payload is None:
            logger.warning("KV disk tier: %s is damaged; removed, its tokens are recomputed", path)
            self.stats.corrupt_entries += 1
            self.remove(key)
            return None
        if key not in self._index:
            self._adopt(key, len(data))
        self._index.move_to_end(key)
        try:
            os.utime(path)  # the LRU order survives a restart
        except OSError:  # another engine on the directory removed it since: the bytes read are whole all the same
            pass
        self.stats.bytes_out += payload.nbytes
        return payload

    def write(self, key: bytes, payload: np.ndarray) -> None:
        """Store the block (atomically), evicting least recently used files past the bound."""
        if key in self._index:
            self._index.move_to_end(key)
            return
        raw = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
        fields = {"fingerprint": self.fingerprint, "key": key.hex(), "dtype": str(payload.dtype),
                  "shape": list(payload.shape), "crc32": zlib.crc32(raw.data)}
        fields["mac"] = self._mac(fields, raw.data)
        header = json.dumps(fields, sort_keys=True).encode()
        size = len(MAGIC) + _HEADER_LENGTH.size + len(header) + raw.nbytes
        if size > self.capacity_bytes:
            return
        self._make_room(size)
        path = self._path(key)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the directory may have been deleted
            write_atomically(path, (MAGIC + _HEADER_LENGTH.pack(len(header)) + header, raw.data), mode=0o600)
        except OSError as error:  # a full or read-only disk costs the tier, never the request
            logger.warning("KV disk tier: could not write %s: %s", path, error)
            return
        self._adopt(key, size)
        self.stats.bytes_in += payload.nbytes

    def keys(self) -> list[bytes]:
        """Every key this engine knows of, least recently used first."""
        return list(self._index)

    def remove(self, key: bytes) -> None:
        """Delete the block's file (if any) and forget it."""
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as error:  # a read-only directory: forgotten all the same (the bound counts what it knows)
            logger.warning("KV disk tier: could not remove %s: %s", self._path(key), error)
        self._forget(key)

    # ---- internals ----

    def _path(self, key: bytes) -> Path:
        name = key.hex()
        return self.directory / name[:2] / (name + SUFFIX)

    def _decode(self, key: bytes, data: bytes) -> Optional[np.ndarray]:
        prefix = len(MAGIC) + _HEADER_LENGTH.size
        if len(data) < prefix or data[:len(MAGIC)] != MAGIC:
            return None
        (header_length,) = _HEADER_LENGTH.unpack_from(data, len(MAGIC))
        try:
            header = json.loads(data[prefix:prefix + header_length])
            if header["dtype"] not in PAYLOAD_DTYPES:  # never let a header pick object or a structured dtype
                return None
            dtype = jnp.dtype(header["dtype"])
            shape = tuple(int(n) for n in header["shape"])
            expected_crc = int(header["crc32"])
            if header["fingerprint"] != self.fingerprint or header["key"] != key.hex():
                return None
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        if not 0 < len(shape) <= MAX_PAYLOAD_DIMS or min(shape) <= 0:
            return None
        if self.block_spec is not None and (header["dtype"], shape) != self.block_spec:
            return None  # self-consistent, but not a block of this pool
        raw = memoryview(data)[prefix + header_length:]
        if len(raw) != int(np.prod(shape)) * dtype.itemsize or zlib.crc32(raw) != expected_crc:
            return None
        mac = header.pop("mac", None)
        if not isinstance(mac, str) or not hmac.compare_digest(mac.encode(), self._mac(header, raw).encode()):
            return None
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def _mac(self, fields: dict, raw: memoryview) -> str:
        """HMAC-SHA256 of the header's other fields (canonical JSON) and the payload."""
        signer = hmac.new(self._mac_key, json.dumps(fields, sort_keys=True).encode(), hashlib.sha256)
        signer.update(raw)
        return signer.hexdigest()

    def _scan(self) -> None:
        """Index the files already here (oldest first) and drop stale temporaries; then enforce the bound."""
        entries = []
        now = time.time()
        for subdirectory in self.directory.iterdir():
            if not subdirectory.is_dir():
                continue
            for entry in os.scandir(subdirectory):
                try:
                    stat = entry.stat()
                except OSError:  # removed by another engine since the directory was listed
                    continue
                if entry.name.endswith(TEMPORARY_SUFFIX):
                    if now - stat.st_mtime > STALE_TEMP_SECONDS:
                        Path(entry.path).unlink(missing_ok=True)
                    continue
                if entry.name.endswith(SUFFIX):
                    try:
                        key = bytes.fromhex(entry.name[:-len(SUFFIX)])
                    except ValueError:
                        continue
                    entries.append((stat.st_mtime, key, stat.st_size))
        for _, key, size in sorted(entries):
            self._adopt(key, size)
        self._make_room(0)

    def _adopt(self, key: bytes, size: int) -> None:
        if key in self._index:
            return
        self._index[key] = size
        self.stats.bytes_used += size
        self.stats.num_blocks = len(self._index)
        if self.events is not None:
            self.events.stored(MEDIUM_DISK, key)

    def _forget(self, key: bytes) -> None:
        size = self._index.pop(key, None)
        if size is not None:
            self.stats.bytes_used -= size
            self.stats.num_blocks = len(self._index)
            if self.events is not None:
                self.events.removed(MEDIUM_DISK, key)

    def _make_room(self, size: int) -> None:
        while self._index and self.stats.bytes_used + size > self.capacity_bytes:
            oldest = next(iter(self._index))
            self.remove(oldest)
