"""The native CPU paged decode kernel (paged_decode.cc): built with the system C++ compiler on first use, cached,
registered as an XLA FFI target, and called inside the jitted step by the "xla" backend for every q row (a prefill
chunk's rows are taken a block at a time, each row at its own position).

Why native: under XLA the gather of a decode's pages is materialized before the dots, so every KV byte is read,
written and read again, far below memory bandwidth (see benchmarks/cpu_decode_attention.py). The kernel reads the
pages in place through the block table. Without a compiler (or with cpu_attention="jnp" in EngineConfig) the jnp
path runs.
"""

import functools
import pathlib
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Shaped

from jaxpaged.kernels.cpu_native.native_build import BASE_FLAGS, register

SOURCE = pathlib.Path(__file__).with_name("paged_decode.cc")
TARGET = "jaxpaged_paged_decode"
# Float reductions may be reordered (vectorized).
FLAGS = (*BASE_FLAGS, "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")
KV_DTYPES = (jnp.float32, jnp.bfloat16, jnp.uint16, jnp.int8, jnp.uint8)
"""KV cache dtypes the kernel reads (uint16: bfloat16 bits, the "interleaved_bits" layout; int8 / uint8: int8 / fp8
codes with a scale per row, the "quantized" layout, dequantized as the kernel streams the rows)."""


@functools.cache
def native_decode_available() -> bool:
    """Whether the kernel is built and registered (once per process); False when it cannot be built (logged once).
    Whether the engine uses it is the start-up plan's choice (EngineConfig.cpu_attention)."""
    return register(SOURCE, FLAGS, "JaxpagedPagedDecode", TARGET, fallback="the jnp attention path")


def paged_decode(q: Float[Array, "rows kv_heads group head_dim"],
                 kv_pages: Shaped[Array, "pages page_size kv_heads_x2 kv_row"],
                 positions: Int[Array, " rows"], row_seqs: Int[Array, " rows"],
                 block_tables: Int[Array, "seqs pages_per_seq"], *, sliding_window: Optional[int],
                 soft_cap: Optional[float],
                 sinks: Optional[Float[Array, " q_heads"]] = None) -> Float[Array, "rows kv_heads group head_dim"]:
    """Each q row (already scaled) over its sequence's pages 0..position (a sliding window if set: from the page of
    its window's first token, never a page before it); row r's sequence is block_tables[row_seqs[r]], and rows at
    position < 0 give zeros. A prefill chunk's rows (consecutive rows of one sequence at consecutive positions) are
    attended a block at a time. sinks: one logit per q head (kv head h's group g is q head h * group + g) in the
    softmax's denominator only; None passes an empty array, which the kernel reads as none. CPU only: call
    native_decode_available() first."""
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32))
    sinks = jnp.zeros((0,), jnp.float32) if sinks is None else sinks.astype(jnp.float32).reshape(-1)
    return call(q.astype(jnp.float32), kv_pages, positions.astype(jnp.int32), row_seqs.astype(jnp.int32),
                block_tables.astype(jnp.int32), sinks, sliding_window=np.int64(sliding_window or 0),
                soft_cap=np.float32(soft_cap or 0.0))
