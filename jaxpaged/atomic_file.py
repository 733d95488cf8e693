"""Files that readers only ever see whole: written beside their target under a temporary name, then renamed over
it (os.replace is atomic), so a process reading at the same time finds the old file or the whole new one."""

import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Union

TEMPORARY_SUFFIX = ".tmp"
"""Ends the name of a file still being written; one left by a crashed writer can be deleted."""


def write_atomically(path: Path, parts: Iterable[Union[bytes, memoryview]], mode: int = 0o666) -> None:
    """Write `parts`, in order, as the file at `path` (its directory must exist), created with `mode` (less the
    umask; 0o600: its owner only). OSError propagates, with the temporary file removed."""
    temporary = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TEMPORARY_SUFFIX}"
    try:
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as file:
            for part in parts:
                file.write(part)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
