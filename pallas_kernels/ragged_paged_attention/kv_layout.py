"""Per-backend KV cache layouts: the shape a backend wants, its physical bytes, and which layout a pool is.

The layouts' own modules sit below this one (kv_layout_packed.py, kv_layout_quantized.py, both over vector_order.py);
this module chooses between them, and the kernels read pages through tpu_kv_reads.py.

"interleaved" (every backend accepts it; jaxpaged/kernels/xla_attention.py, gpu.py and spec.py use only it):
  per layer [num_pages, page_size, 2 * num_kv_heads, head_dim], K of head h at 2h, V at 2h + 1.
  On TPU HBM/VMEM the last two dims are tiled (8 * packing sublanes, 128 lanes): 6 heads of head_dim
  64 in bfloat16 occupy a 16 x 128 tile, 5.3x their logical bytes.

"interleaved_bits" (the "xla" backend, bfloat16 only): the interleaved shape holding each bfloat16's uint16
  bits. XLA:CPU has no bfloat16 scatter: it converts the whole operand to float32 and back, so writing one
  step's 64 slots into a 30,000-page bfloat16 pool costs ~250 ms, against ~0.01 ms for the same scatter on
  uint16. The pool is therefore kept as integers (bfloat16_bits.py); readers bitcast what they gathered.

"quantized" (kv_cache_dtype "int8" / "fp8_e4m3"; the "xla" backend): per layer [num_pages, page_size,
  2 * num_kv_heads, head_dim + SCALE_BYTES] of int8 (int8 codes) or uint8 (fp8 bits): each K / V row is its head_dim
  codes then its own bfloat16 scale's bytes (kv_quantization.py), so anything that moves rows moves their scales.

"packed" (TPU only): per layer uint32 words [num_pages, page_size * rows_per_token, 128]. A token is
  a list of 128-lane *vectors* of the cache dtype: for head_dim 64, vector h = [K_h | V_h] side by
  side; for head_dim a multiple of 128, K_h's lane tiles then V_h's. Consecutive vectors share 32-bit
  words: bfloat16 packs vector 2j in the low and 2j+1 in the high 16 bits (so with head_dim 128, K_h
  and V_h share word row h); float32 has one vector per row. Rows are whole tiles, so no padding:
  physical bytes == logical bytes (up to an odd head count in bfloat16). Kernels load a vector with
  one sublane-strided uint32 load (stride rows_per_token) and split halves with shifts and bitcasts.

  Under tensor parallelism (num_shards > 1) a page's rows are shard-major: [shard 0's packed rows of its
  num_kv_heads / num_shards heads | shard 1's | ...], per layer [num_pages, num_shards * page_size * rows, 128]
  with `rows` counted from the per-shard heads. Split on its row axis (runner/mesh.py), each device holds the
  packed layout of exactly its own heads: what the kernels read, tile-exact per shard (the interleaved layout's
  per-shard [2 * kv_heads / tp, head_dim] tile pads to 16 sublanes in the kernels' VMEM buffers: 8x the bytes
  at Llama-3-8B's tp 8).

"packed_quantized" (TPU only; kv_cache_dtype "int8" / "fp8_e4m3" on pallas_tpu): uint32 [num_pages, num_shards *
  page_rows, 128], 4 tokens' 8-bit codes per word and each page's scales in rows of its own, page_rows a whole number
  of (8, 128) tiles: kv_layout_quantized.py has the format and its bytes (about half the bfloat16 packed layout's
  per token; no saving for one KV head per shard at page_size 16). cache_shape takes the pool dtype (int8 / uint8)
  as for "quantized"; the returned dtype is uint32.

The runner should allocate cache_shape(...) of the chosen backend and size the pool by
physical_bytes(...) of one shard's shape; kv_layout_packed.pack_kv_pages / unpack_kv_pages convert between the
interleaved and packed layouts (tests, tools).
"""

from typing import Union

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int8, Shaped, UInt8, UInt32

from pallas_kernels.bfloat16_bits import BITS_DTYPE, to_bits
from pallas_kernels.kv_quantization import SCALE_BYTES, format_of_pool, is_quantized_pool, quantize_rows
from pallas_kernels.ragged_paged_attention.kv_layout_packed import packed_layout_for
from pallas_kernels.ragged_paged_attention.kv_layout_quantized import packed_quantized_shape, quantized_layout_for
from pallas_kernels.ragged_paged_attention.vector_order import LANES

LAYOUTS = ("interleaved", "interleaved_bits", "quantized", "packed", "packed_quantized")

QuantizedPages = Union[Int8[Array, "num_pages page_size kv_heads_x2 quantized_row"],
                       UInt8[Array, "num_pages page_size kv_heads_x2 quantized_row"]]
"""The quantized layout: rows of head_dim codes + SCALE_BYTES scale bytes (int8 or uint8)."""
# NOTE: the quantized variants come first: their dtype rules them out for float pools before any dim is bound, while
# a Shaped variant first would bind head_dim to a quantized row's width.
KVPages = Union[QuantizedPages, Shaped[Array, "num_pages page_size kv_heads_x2 head_dim"],
                UInt32[Array, "num_pages rows lanes"]]
"""A (layer's) page pool in any layout: interleaved [pages, page_size, 2 * kv_heads, head_dim] (floats, or
bfloat16 bits as uint16), quantized or packed."""


def cache_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, dtype, layout: str,
                num_shards: int = 1):
    """(shape, dtype) of one layer's cache in `layout` over `num_shards` tensor-parallel shards (split on axis -2,
    see the module docstring); the runner stacks layers on a new axis 0 (`dtype`: the values' dtype, or for
    "quantized" the pool's, int8 or uint8: kv_quantization.quantized_pool_dtype)."""
    if num_shards < 1 or num_kv_heads % num_shards:
        raise ValueError(f"num_shards: must be a positive divisor of num_kv_heads ({num_kv_heads}), got {num_shards}")
    if layout == "interleaved":
        return (num_pages, page_size, 2 * num_kv_heads, head_dim), jnp.dtype(dtype)
    if layout == "interleaved_bits":
        if jnp.dtype(dtype) != jnp.bfloat16:
            raise ValueError(f"dtype: the interleaved_bits layout holds bfloat16, got {jnp.dtype(dtype)}")
        return (num_pages, page_size, 2 * num_kv_heads, head_dim), BITS_DTYPE
    if layout == "quantized":
        if not is_quantized_pool(dtype):
            raise ValueError(f"dtype: the quantized layout is an int8 or uint8 pool, got {jnp.dtype(dtype)}")
        return (num_pages, page_size, 2 * num_kv_heads, head_dim + SCALE_BYTES), jnp.dtype(dtype)
    if layout == "packed":
        rows = packed_layout_for(num_kv_heads // num_shards, head_dim, dtype).rows_per_token
        return (num_pages, num_shards * page_size * rows, LANES), jnp.dtype(jnp.uint32)
    if layout == "packed_quantized":
        if not is_quantized_pool(dtype):
            raise ValueError(f"dtype: the packed_quantized layout is named by an int8 or uint8 pool dtype, got "
                             f"{jnp.dtype(dtype)}")
        return packed_quantized_shape(num_pages, page_size, num_kv_heads, head_dim, format_of_pool(dtype),
                                      num_shards)
    raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}")


def tokens_per_page(kv_pages: KVPages, num_kv_heads: int, head_dim: int, dtype) -> int:
    """Tokens one page of `kv_pages` holds, in any layout: axis 1 counts tokens, or the packed layout's word rows
    (rows_per_token of them per token), which is not a page size: slots are counted in tokens."""
    if kv_pages.ndim == 3:
        return kv_pages.shape[1] // packed_layout_for(num_kv_heads, head_dim, dtype).rows_per_token
    return kv_pages.shape[1]


def physical_bytes(shape, dtype, platform: str) -> int:
    """Bytes an array occupies on `platform`: TPU pads its last two dims to (8 * packing, 128) tiles."""
    itemsize = jnp.dtype(dtype).itemsize
    if platform != "tpu" or len(shape) < 2:
        return int(np.prod(shape)) * itemsize
    sublanes = 8 * max(1, 4 // itemsize)
    *lead, rows, lanes = shape
    return int(np.prod(lead)) * (-(-rows // sublanes) * sublanes) * (-(-lanes // LANES) * LANES) * itemsize


def kv_storage(values: Float[Array, "*rows head_dim"], pool_dtype) -> Shaped[Array, "*rows row"]:
    """Values as an interleaved pool of `pool_dtype` stores them (rounded to bfloat16 first for uint16 bits; an int8
    or uint8 pool holds quantized rows, one scale per row: kv_quantization.py)."""
    if is_quantized_pool(pool_dtype):
        return quantize_rows(values, pool_dtype)
    if jnp.dtype(pool_dtype) == BITS_DTYPE:
        return to_bits(values.astype(jnp.bfloat16))
    return values.astype(pool_dtype)


def kernel_layout(kv_pages, head_dim: int, dtype, num_kv_heads=None, kv_cache_dtype: str = "auto", page_size=None):
    """(layout, page_size, kv_heads_x2) the TPU kernels read `kv_pages` with: None for interleaved, a PackedLayout,
    or for a quantized kv_cache_dtype a QuantizedPackedLayout (kv_layout_quantized.py; page_size required, as a
    page's rows do not say it). ValueError naming the field for a pool that is not that layout's shape."""
    if kv_pages.ndim != 3:
        if kv_cache_dtype != "auto":
            raise ValueError(f"kv_pages: kv_cache_dtype {kv_cache_dtype!r} needs the packed quantized layout "
                             f"(uint32 [num_pages, rows, 128]), got {kv_pages.dtype} {kv_pages.shape}")
        return None, kv_pages.shape[1], kv_pages.shape[2]
    if num_kv_heads is None:
        raise ValueError("num_kv_heads: required with the packed KV layout")
    if kv_cache_dtype == "auto":
        layout = packed_layout_for(num_kv_heads, head_dim, dtype)
        page_size = kv_pages.shape[1] // layout.rows_per_token
        expected = page_size * layout.rows_per_token
    else:
        if page_size is None:
            raise ValueError("page_size: required with the packed quantized KV layout")
        layout = quantized_layout_for(num_kv_heads, head_dim, kv_cache_dtype, page_size)
        expected = layout.page_rows
    if kv_pages.shape[1:] != (expected, LANES) or kv_pages.dtype != jnp.uint32 or expected == 0:
        raise ValueError(f"kv_pages: the {type(layout).__name__} of {num_kv_heads} heads must be uint32 "
                         f"[num_pages, {expected or 'page_size * rows'}, {LANES}], got {kv_pages.dtype} "
                         f"{kv_pages.shape}")
    return layout, page_size, 2 * num_kv_heads
