"""Building and registering the native CPU kernels: each .cc file of this folder is compiled with the system C++
compiler on first use, cached per source, flags, compiler, jaxlib and CPU, and registered as an XLA FFI target.
"""

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import re
import subprocess
import tempfile
from collections.abc import Sequence

import jax

logger = logging.getLogger(__name__)

# Built for this very CPU (the build key holds its identity). No -ffast-math: infinities and NaNs stay meaningful;
# each kernel adds the looser float rules it was written for. -fno-tree-loop-distribute-patterns: GCC otherwise
# turns the zeroing of a tile's register accumulators into memset calls, a visible share of a prefill step.
BASE_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno",
              "-fno-tree-loop-distribute-patterns")


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jaxpaged" / "native"


def cpu_identity() -> str:
    """This CPU as a cache key: its architecture, model name and every flag. Code built for one CPU (-march=native),
    or a speed measured on it (the dtype probe), must not be reused on another."""
    lines = []
    if pathlib.Path("/proc/cpuinfo").exists():
        lines = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line for line in lines if line.startswith("model name")), "")
    flags = next((line for line in lines if line.startswith("flags")), "")
    return "\n".join((platform.machine(), model, flags))


def source_digest(*sources: pathlib.Path) -> str:
    """The sources and the local headers each includes (`#include "name.h"`, beside it): what a build, or a speed
    measured on the built code (the start-up probes), depends on in this folder."""
    digest = hashlib.sha256()
    for source in sources:
        text = source.read_bytes()
        digest.update(text)
        for name in sorted(set(re.findall(rb'^#include "([^"/]+)"', text, flags=re.MULTILINE))):
            header = source.parent / name.decode()
            if header.exists():  # "xla/ffi/api/ffi.h" and the like come from jax's include directory, not from here
                digest.update(name + header.read_bytes())
    return digest.hexdigest()


def _build_key(source: pathlib.Path, flags: Sequence[str], compiler: str) -> str:
    """source_digest, flags, compiler, jaxlib and this CPU (-march=native code must not run on another CPU)."""
    digest = hashlib.sha256(source_digest(source).encode())
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    for part in (" ".join(flags), version, jax.__version__, cpu_identity()):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


@functools.cache
def build_library(source: pathlib.Path, flags: tuple[str, ...]) -> pathlib.Path:
    """The compiled `source`, built now unless a build for this source, flags, compiler and CPU is cached (on disk,
    and per process: a library with several handlers is looked up once, not once per handler)."""
    compiler = os.environ.get("CXX", "g++")
    target = _cache_dir() / f"{source.stem}-{_build_key(source, flags, compiler)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes building at once each get a whole library.
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as partial:
        partial_path = pathlib.Path(partial.name)
    try:
        subprocess.run([compiler, *flags, f"-I{jax.ffi.include_dir()}", str(source), "-o", str(partial_path)],
                       capture_output=True, text=True, check=True)
        os.replace(partial_path, target)
    finally:
        partial_path.unlink(missing_ok=True)
    return target


def register(source: pathlib.Path, flags: Sequence[str], symbol: str, target: str, fallback: str) -> bool:
    """Build `source`, register its FFI handler `symbol` as the CPU custom call `target`; False when the library
    cannot be built or loaded, logged once with what runs instead (`fallback`)."""
    try:
        library = ctypes.cdll.LoadLibrary(str(build_library(source, tuple(flags))))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        logger.warning("native CPU kernel %s unavailable, using %s: %s", source.name, fallback, detail[-2000:])
        return False
    if not hasattr(library, symbol):  # built only where the CPU has what it needs (#if in the source)
        logger.info("native CPU kernel %s has no %s on this CPU, using %s", source.name, symbol, fallback)
        return False
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    return True
