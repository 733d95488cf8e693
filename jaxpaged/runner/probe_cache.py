"""Where the start-up probes (dtype_probe.py, int8_probe.py) keep a verdict measured on this machine, and how they
read it back: one small JSON file per key, under the cache directory, written whole.

A probe's time depends on the CPU (model and every flag), JAX and whatever else its caller names (the shapes it
timed, the kernels' sources): all of it goes into the file's name, so another CPU or model measures again rather
than reading a verdict that is not its own.
"""

import hashlib
import json
import logging
import pathlib
from typing import Any

import jax

from jaxpaged.atomic_file import write_atomically
from jaxpaged.kernels.cpu_native.native_build import cpu_identity
from jaxpaged.weights.loader import cache_root

logger = logging.getLogger(__name__)


def verdict_file(probe: str, *parts: str) -> pathlib.Path:
    """`probe`'s verdict file for this CPU and JAX and the caller's `parts`."""
    digest = hashlib.sha256()
    for part in (cpu_identity(), jax.__version__, *parts):
        digest.update(part.encode())
        digest.update(b"\0")  # ("ab", "c") and ("a", "bc") are different keys
    return cache_root() / probe / f"{digest.hexdigest()[:16]}.json"


def read_verdict(path: pathlib.Path) -> Any:
    """The JSON kept at `path`, or None when there is none or it does not parse (the caller checks its fields)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def keep_verdict(path: pathlib.Path, verdict: Any) -> None:
    """Kept whole (atomic_file), so a process starting at the same time reads all of it or nothing; a cache that
    cannot be written only costs the next start the probe."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, (json.dumps(verdict).encode(),))
    except OSError as error:
        logger.debug("probe verdict not kept at %s: %s", path, error)
