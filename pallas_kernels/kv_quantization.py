"""Quantized KV cache rows (EngineConfig kv_cache_dtype "int8" / "fp8_e4m3"): each token's K (and V) of one KV head
is stored as head_dim 8-bit codes followed by its own scale, SCALE_BYTES more bytes in the same row.

Why per token and per head, in the row: a paged cache fills token by token, so a token's scale must be known when
the token is written, and nothing written earlier may change. A per-block or per-tensor scale would need either a
calibration pass (vLLM's fp8 scales) or a rewrite of the block when a later token is larger. Keeping the scale in the
row means every array that moves KV (block copies, the host / disk tiers, the tensor-parallel split on the kv-head
axis) moves the scale with its values without knowing it is there.

The scale is bfloat16, rounded *up* from absmax / QMAX, so every code fits without clipping: int8 codes are
round-half-even(x / scale) in [-127, 127] and a value comes back within scale / 2; fp8 codes are float8_e4m3fn of
x / scale in [-448, 448] (relative error 2^-4, absolute 2^-10 * scale below fp8's normal range). A row of zeros has
scale 0 and reads back as zeros. Dequantization is code * scale in float32, exact for both formats (an 8-bit code
times an 8-bit-mantissa scale fits float32's 24 bits).

Pool dtypes: int8 codes in an int8 pool; fp8 codes as their raw bits in a uint8 pool (XLA:CPU converts a float8
scatter's whole operand like bfloat16's, kv_layout.py). The pool's dtype alone tells a reader which format it holds.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Shaped

KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3")
"""kv_cache_dtype's values (vLLM's names): "auto" keeps the model dtype; "fp8" is "fp8_e4m3"."""
SCALE_DTYPE = jnp.dtype(jnp.bfloat16)
SCALE_BYTES = SCALE_DTYPE.itemsize
"""Bytes a row's scale adds after its head_dim codes."""
INT8_MAX = 127.0
FP8_MAX = 448.0
"""The largest finite float8_e4m3fn (it has no infinity: a larger value converts to NaN)."""
_POOL_DTYPES = {"int8": jnp.dtype(jnp.int8), "fp8_e4m3": jnp.dtype(jnp.uint8)}


def canonical_kv_cache_dtype(name: str) -> str:
    """"fp8" -> "fp8_e4m3"; the other names unchanged (ValueError naming kv_cache_dtype for an unknown one)."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: must be one of {KV_CACHE_DTYPES}, got {name!r}")
    return "fp8_e4m3" if name == "fp8" else name


def quantized_pool_dtype(kv_cache_dtype: str) -> np.dtype:
    """The pool dtype of a quantized kv_cache_dtype: int8 for "int8", uint8 (fp8 bits) for "fp8_e4m3"."""
    return _POOL_DTYPES[canonical_kv_cache_dtype(kv_cache_dtype)]


def is_quantized_pool(dtype) -> bool:
    """Whether a pool of `dtype` holds quantized rows (codes + scale) rather than model-dtype values."""
    return jnp.dtype(dtype) in _POOL_DTYPES.values()


def format_of_pool(dtype) -> str:
    """"int8" or "fp8_e4m3" for a quantized pool's dtype."""
    return {value: key for key, value in _POOL_DTYPES.items()}[jnp.dtype(dtype)]


def pool_row_width(head_dim: int, pool_dtype) -> int:
    """Elements of one token's K (or V) row of one KV head in an interleaved pool of `pool_dtype`: head_dim codes and
    SCALE_BYTES scale bytes in a quantized pool, head_dim values in any other."""
    return head_dim + SCALE_BYTES if is_quantized_pool(pool_dtype) else head_dim


def _scale_up(absmax: Float[Array, "*rows"], qmax: float) -> Float[Array, "*rows"]:
    """absmax / qmax rounded up to the next bfloat16, as float32 (positive finite inputs: adding 0xFFFF to the
    float32 bits then dropping the low 16 carries into the bfloat16 part whenever any dropped bit was set)."""
    bits = jax.lax.bitcast_convert_type((absmax / qmax).astype(jnp.float32), jnp.uint32)
    return jax.lax.bitcast_convert_type((bits + jnp.uint32(0xFFFF)) & jnp.uint32(0xFFFF0000), jnp.float32)


def quantize_rows(values: Float[Array, "*rows head_dim"], pool_dtype) -> Shaped[Array, "*rows row_bytes"]:
    """Each row of `values` as head_dim codes then its bfloat16 scale's bytes, in `pool_dtype` (int8 or uint8)."""
    values = values.astype(jnp.float32)
    pool_dtype = jnp.dtype(pool_dtype)
    qmax = INT8_MAX if pool_dtype == jnp.int8 else FP8_MAX
    scale = _scale_up(jnp.max(jnp.abs(values), axis=-1), qmax)
    scaled = jnp.where(scale[..., None] > 0, values / jnp.where(scale > 0, scale, 1.0)[..., None], 0.0)
    scaled = jnp.clip(scaled, -qmax, qmax)  # a no-op but for float rounding at the edge; fp8 would turn it into NaN
    if pool_dtype == jnp.int8:
        codes = jnp.round(scaled).astype(jnp.int8)
    else:
        codes = jax.lax.bitcast_convert_type(scaled.astype(jnp.float8_e4m3fn), jnp.uint8)
    scale_bytes = jax.lax.bitcast_convert_type(scale.astype(SCALE_DTYPE), pool_dtype)
    return jnp.concatenate([codes, scale_bytes], axis=-1)


def dequantize_rows(stored: Shaped[Array, "*rows row_bytes"]) -> Float[Array, "*rows head_dim"]:
    """float32 values of quantized rows (codes times the row's scale)."""
    codes, scale_bytes = stored[..., :-SCALE_BYTES], stored[..., -SCALE_BYTES:]
    scale = jax.lax.bitcast_convert_type(scale_bytes, SCALE_DTYPE).astype(jnp.float32)
    if stored.dtype == jnp.int8:
        values = codes.astype(jnp.float32)
    else:
        values = jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn).astype(jnp.float32)
    return values * scale[..., None]


def row_scales(stored: Shaped[Array, "*rows row_bytes"]) -> Float[Array, "*rows"]:
    """The float32 scale of each quantized row (tests, tools)."""
    return jax.lax.bitcast_convert_type(stored[..., -SCALE_BYTES:], SCALE_DTYPE).astype(jnp.float32)
