"""The disk tier's trust checks: a directory only its owner can write, and the HMAC key that signs its files.

Every disk-tier file is signed (HMAC-SHA256, disk_tier.py). The key is kv_offload_key (JAXPAGED_KV_OFFLOAD_KEY) when
given; otherwise one generated once and kept beside the tier in <root>/.hmac-key, mode 0600, so a restarted engine
(or another engine of the same user sharing the directory) checks the files the last one wrote. A CRC alone would
let anyone who can write the directory plant K/V that a restarted engine serves as another prompt's.

The checks refuse what would make the signature moot: a root or fingerprint directory that another user owns or
that group or others may write (they could replace the key file, or the files and the key together), and a key file
that is not a regular file of this user with mode 0600 or stricter (others could read it and forge).
"""

import os
import secrets
import stat
import uuid
from pathlib import Path

KEY_FILE_NAME = ".hmac-key"
"""The generated key's file in the tier's root directory."""
KEY_BYTES = 32
"""Random bytes of a generated key (written as hex)."""


def check_private_directory(path: Path) -> None:
    """ValueError naming kv_offload_dir unless `path` is a directory this user owns that group and others cannot
    write."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise ValueError(f"kv_offload_dir: --kv-offload-dir {path} cannot be read: {error}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"kv_offload_dir: --kv-offload-dir {path} is not a directory")
    if info.st_uid != os.geteuid():
        raise ValueError(f"kv_offload_dir: --kv-offload-dir {path} is owned by uid {info.st_uid}, not this user "
                         f"(uid {os.geteuid()}): its owner could plant K/V and the key that signs it; use a "
                         f"directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"kv_offload_dir: --kv-offload-dir {path} is writable by group or others (mode "
                         f"{stat.S_IMODE(info.st_mode):#o}): they could plant K/V files; `chmod go-w` it "
                         f"(0700 is best: the files hold every tenant's prompts) or use another directory")


def load_or_create_key(root: Path) -> bytes:
    """The tier's signing key from <root>/.hmac-key, created (atomically: whole, or not at all) if absent;
    ValueError naming kv_offload_dir for a key file that others may read or write, or that is not a key."""
    path = root / KEY_FILE_NAME
    if not path.exists():
        _create_key_file(path)
    return _read_key_file(path)


def _create_key_file(path: Path) -> None:
    # NOTE: written whole under a temporary name (O_EXCL, 0600) and then linked to its name, which fails if it
    # exists: two engines starting together agree on one key and neither ever reads a half-written file.
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with open(descriptor, "w") as file:
                file.write(secrets.token_hex(KEY_BYTES) + "\n")
            os.link(temporary, path)
        except FileExistsError:
            pass  # another engine made it first: use theirs
        finally:
            temporary.unlink(missing_ok=True)
    except OSError as error:
        raise ValueError(f"kv_offload_dir: cannot create the disk tier's key file {path} ({error}); set "
                         f"JAXPAGED_KV_OFFLOAD_KEY (kv_offload_key) to sign with a key of your own") from None


def _read_key_file(path: Path) -> bytes:
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        raise ValueError(f"kv_offload_dir: cannot open the disk tier's key file {path}: {error}") from None
    with open(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError(f"kv_offload_dir: the disk tier's key file {path} is not a regular file of this user")
        if info.st_mode & 0o077:
            raise ValueError(f"kv_offload_dir: the disk tier's key file {path} has mode "
                             f"{stat.S_IMODE(info.st_mode):#o}; it must be 0600 (others could read it and forge "
                             f"K/V): `chmod 600` it, or delete it to make a new one (the tier's files become misses)")
        key = file.read(4 * KEY_BYTES).strip()
    if len(key) < KEY_BYTES:
        raise ValueError(f"kv_offload_dir: the disk tier's key file {path} holds {len(key)} bytes, not a key; "
                         f"delete it to make a new one (the tier's files become misses)")
    return key
