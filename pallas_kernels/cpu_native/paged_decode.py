"""The native CPU paged decode kernel (paged_decode.cc): built with the system C++ compiler on first use, cached,
registered as an XLA FFI target, and called inside the jitted step by the "xla" backend for every q row (a prefill
row is a decode row at its own position).

Why native: under XLA the gather of a decode's pages is materialized before the dots, so every KV byte is read,
written and read again, far below memory bandwidth (see benchmarks/cpu_decode_attention.py). The kernel reads the
pages in place through the block table. Without a compiler (or with JAXPAGED_CPU_ATTENTION=jnp) the jnp path runs.
"""

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import subprocess
import tempfile
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Shaped

logger = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("paged_decode.cc")
TARGET = "jaxpaged_paged_decode"
# Float reductions may be reordered (vectorized); infinities stay meaningful (no -ffast-math).
FLAGS = ["-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno", "-fassociative-math",
         "-fno-signed-zeros", "-fno-trapping-math"]
KV_DTYPES = (jnp.float32, jnp.bfloat16, jnp.uint16)
"""KV cache dtypes the kernel reads (uint16: bfloat16 bits, the "interleaved_bits" layout)."""


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


def _build_key(compiler: str) -> str:
    """Source, flags, compiler, jaxlib and this CPU (-march=native code must not run on another CPU)."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    for part in (" ".join(FLAGS), version, jax.__version__, cpu_identity()):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def build_library() -> pathlib.Path:
    """The compiled kernel, built now unless a build for this source, compiler and CPU is cached."""
    compiler = os.environ.get("CXX", "g++")
    target = _cache_dir() / f"paged_decode-{_build_key(compiler)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes building at once each get a whole library.
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as partial:
        partial_path = pathlib.Path(partial.name)
    try:
        subprocess.run([compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", str(partial_path)],
                       capture_output=True, text=True, check=True)
        os.replace(partial_path, target)
    finally:
        partial_path.unlink(missing_ok=True)
    return target


@functools.cache
def native_decode_available() -> bool:
    """Whether the kernel is built and registered (once per process); False with JAXPAGED_CPU_ATTENTION=jnp or
    when it cannot be built (logged once)."""
    if os.environ.get("JAXPAGED_CPU_ATTENTION", "native") == "jnp":
        return False
    try:
        library = ctypes.cdll.LoadLibrary(str(build_library()))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        logger.warning("native CPU decode attention unavailable, using the jnp path: %s", detail[-2000:])
        return False
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.JaxpagedPagedDecode), platform="cpu")
    return True


def paged_decode(q: Float[Array, "seqs kv_heads group head_dim"],
                 kv_pages: Shaped[Array, "pages page_size kv_heads_x2 head_dim"],
                 positions: Int[Array, " seqs"], block_tables: Int[Array, "seqs pages_per_seq"], *,
                 sliding_window: Optional[int],
                 soft_cap: Optional[float]) -> Float[Array, "seqs kv_heads group head_dim"]:
    """Each sequence's one new token (q, already scaled) over its pages 0..position (a sliding window if set);
    sequences at position < 0 give zeros. CPU only: call native_decode_available() first."""
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    return call(q.astype(jnp.float32), kv_pages, positions.astype(jnp.int32), block_tables.astype(jnp.int32),
                sliding_window=np.int64(sliding_window or 0), soft_cap=np.float32(soft_cap or 0.0))
