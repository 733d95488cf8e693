"""The TPU-native quantized KV layout ("packed_quantized": kv_cache_dtype "int8" / "fp8_e4m3" on pallas_tpu).

Why not the "quantized" rows of kv_quantization.py: a TPU tile of 8-bit data is (32 sublanes, 128 lanes), so a
[2 * kv_heads, head_dim + 2] row pads to 256 lanes and to 32 sublanes: more bytes than bfloat16. Here a page is
whole uint32 word rows [page_rows, 128], as in the bfloat16 "packed" layout (kv_layout_packed.py), in two regions:

  codes: the page's tokens in quads of 4 consecutive tokens; quad i, vector v (the packed layout's vector order:
    [K_h | V_h] for head_dim 64, else K_h's lane tiles then V_h's) is word row i * V + v (V = vectors per token),
    byte j of each word is token 4i + j's 8-bit code (int8 two's complement, or float8_e4m3fn bits). Tokens, not
    vectors, share a word: a token with one KV head per shard (2 vectors, or 1 at head_dim 64) still fills its rows.
  scales: word t * kv_heads + h (t: token in the page) of the rows after the codes holds head h's K scale (bfloat16
    bits, low 16) and V scale (high 16) of token t (kv_quantization.py's per-token-per-head scales).
  page_rows = roundup(page_size / 4 * V + ceil(page_size * kv_heads / 128), 8): a page is whole (8, 128) uint32
    tiles, so its one DMA lands tile-aligned in the kernels' VMEM buffer and nothing else pads in HBM.

Everything about a token lives inside its page, so block copies, the host / disk tiers and the tensor-parallel row
split (shard-major rows, each shard a whole page_rows of its own heads, as in "packed") move codes and scales
together without knowing. The kernels read a vector of n tokens (whole pages) with page_size / 4 sublane-strided
loads of stride page_rows (tpu_quantized_kv.py); tokens come out page-minor (row t * pages + p is token t of page p),
an order the kernels' masks follow (attention does not care about the order of its keys).

Bytes per token per shard (page_size 16 / 128; bfloat16 "packed" in brackets): SmolLM2 (3 KV heads, head_dim 64)
512 / 416 [1024]; Llama-3-8B tp 1 (8 heads, 128) 2304 / 2080 [4096]; Llama-3-8B tp 8 (1 head per shard) 512 / 288
[512]: at page 16 one head per shard pads 9 rows to 16 and saves nothing; page_size >= 64 saves >= 37 %.
Writes touch whole words shared by 4 tokens and a page's scale rows, so they merge (write_kv_packed_quantized).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Shaped, UInt32

from pallas_kernels.kv_quantization import (
    SCALE_BYTES,
    canonical_kv_cache_dtype,
    format_of_pool,
    quantize_rows,
    quantized_pool_dtype,
)
from pallas_kernels.ragged_paged_attention.kv_layout_packed import packed_layout_for
from pallas_kernels.ragged_paged_attention.vector_order import LANES, VectorOrder

FORMATS = ("int8", "fp8_e4m3")
_TILE_ROWS = 8
QUAD = 4
"""Tokens sharing one uint32 word: 4 codes of 8 bits."""


@dataclasses.dataclass(frozen=True)
class QuantizedPackedLayout(VectorOrder):
    """Where a page's codes and scales sit in its uint32 rows (static; hashable); a token's vectors in the bfloat16
    packed layout's order (VectorOrder)."""

    kv_format: str
    page_size: int

    def __post_init__(self):
        super().__post_init__()
        if self.kv_format not in FORMATS:
            raise ValueError(f"kv_cache_dtype: the packed quantized layout holds {FORMATS}, got {self.kv_format!r}")
        if self.page_size < QUAD or self.page_size % QUAD:
            raise ValueError(f"page_size: the packed quantized layout needs a multiple of {QUAD}, got "
                             f"{self.page_size}")

    @property
    def code_rows(self) -> int:
        return self.page_size // QUAD * self.vectors_per_token

    @property
    def scale_rows(self) -> int:
        return -(-self.page_size * self.num_kv_heads // LANES)

    @property
    def page_rows(self) -> int:
        rows = self.code_rows + self.scale_rows
        return -(-rows // _TILE_ROWS) * _TILE_ROWS

    def bytes_per_token(self) -> float:
        """HBM bytes per token per shard (padding included)."""
        return self.page_rows * LANES * 4 / self.page_size


def quantized_layout_for(num_kv_heads: int, head_dim: int, kv_cache_dtype: str, page_size: int
                         ) -> QuantizedPackedLayout:
    return QuantizedPackedLayout(num_kv_heads, head_dim, canonical_kv_cache_dtype(kv_cache_dtype), page_size)


def packed_quantized_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, kv_cache_dtype: str,
                           num_shards: int = 1):
    """(shape, dtype) of one layer's pool: uint32 [num_pages, num_shards * page_rows, 128], shard-major rows."""
    if num_shards < 1 or num_kv_heads % num_shards:
        raise ValueError(f"num_shards: must be a positive divisor of num_kv_heads ({num_kv_heads}), got {num_shards}")
    layout = quantized_layout_for(num_kv_heads // num_shards, head_dim, kv_cache_dtype, page_size)
    return (num_pages, num_shards * layout.page_rows, LANES), jnp.dtype(jnp.uint32)


# --- Host-side packing (jnp): tests, tools, and the write path. ------------------------------------------------------

def _codes_and_scale_bits(stored: Shaped[Array, "*rows row_bytes"]):
    """uint32 codes [*rows, head_dim] (the byte values) and uint32 bfloat16 scale bits [*rows] of quantized rows."""
    codes = jax.lax.bitcast_convert_type(stored[..., :-SCALE_BYTES], jnp.uint8).astype(jnp.uint32)
    scale = jax.lax.bitcast_convert_type(stored[..., -SCALE_BYTES:].astype(stored.dtype), jnp.uint16)
    return codes, scale.astype(jnp.uint32)


def _token_vectors(codes: UInt32[Array, "tokens kv_heads_x2 head_dim"], layout: QuantizedPackedLayout
                   ) -> UInt32[Array, "tokens vectors lanes"]:
    """One token's codes as its V vectors of 128 byte values, in the packed vector order."""
    tokens = codes.shape[0]
    keys, values = codes[:, 0::2], codes[:, 1::2]
    if layout.combined:
        return jnp.concatenate([keys, values], axis=-1)
    split = lambda x: x.reshape(tokens, layout.num_kv_heads, 1, layout.lane_tiles, LANES)  # noqa: E731
    return jnp.concatenate([split(keys), split(values)], axis=2).reshape(tokens, -1, LANES)


def write_packed_quantized_rows(pages: UInt32[Array, "num_pages rows lanes"],
                                stored: Shaped[Array, "tokens kv_heads_x2 row_bytes"],
                                slot_mapping: Int[Array, " tokens"], layout: QuantizedPackedLayout,
                                num_shards: int = 1) -> UInt32[Array, "num_pages rows lanes"]:
    """Quantized rows (kv_quantization.quantize_rows, [tokens, 2 * kv_heads, head_dim + 2]) into their slots.

    Words are shared by 4 tokens (and scale rows by a page's tokens), so each token adds to its quad's V rows and its
    page's scale rows the (new - old) of its own fields only: disjoint fields make the sum of several tokens' deltas
    exact (modulo 2^32) whatever the order, so a prefill's tokens of one quad need no serial merge. Slots must be
    distinct outside the null page 0 (whose content is garbage by contract)."""
    if num_shards > 1:
        shard = dataclasses.replace(layout, num_kv_heads=layout.num_kv_heads // num_shards)
        parts = jnp.split(pages, num_shards, axis=1)
        rows = jnp.split(stored, num_shards, axis=1)
        return jnp.concatenate([write_packed_quantized_rows(p, r, slot_mapping, shard) for p, r in zip(parts, rows)],
                               axis=1)
    tokens = stored.shape[0]
    page_ids, offsets = slot_mapping // layout.page_size, slot_mapping % layout.page_size
    codes, scales = _codes_and_scale_bits(stored)
    # A token's rows: the V rows of its quad (its codes are byte offset % 4 of each word), then its page's scale rows.
    # One gather and one scatter-add of whole 128-lane rows: two scatters made XLA:TPU copy the pool in the step.
    code_rows = (offsets // QUAD * layout.vectors_per_token)[:, None] + jnp.arange(layout.vectors_per_token)[None]
    scale_rows = jnp.broadcast_to(layout.code_rows + jnp.arange(layout.scale_rows), (tokens, layout.scale_rows))
    rows = jnp.concatenate([code_rows, scale_rows], axis=1)
    old = pages[page_ids[:, None], rows]  # [tokens, V + scale_rows, 128]
    old_codes, old_scales = old[:, :layout.vectors_per_token], old[:, layout.vectors_per_token:].reshape(tokens, -1)
    shifts = (8 * (offsets % QUAD)).astype(jnp.uint32)[:, None, None]
    code_deltas = (_token_vectors(codes, layout) << shifts) - (old_codes & (jnp.uint32(0xFF) << shifts))
    # Scales: words offset * kv_heads + h of the scale rows, K in the low half, V in the high.
    words = offsets[:, None] * layout.num_kv_heads + jnp.arange(layout.num_kv_heads)[None]
    changes = (scales[:, 0::2] | (scales[:, 1::2] << 16)) - jnp.take_along_axis(old_scales, words, axis=1)
    scale_deltas = jax.vmap(lambda word, change: jnp.zeros(old_scales.shape[1], jnp.uint32).at[word].set(change))(
        words, changes).reshape(tokens, layout.scale_rows, LANES)
    deltas = jnp.concatenate([code_deltas, scale_deltas], axis=1)
    return pages.at[page_ids[:, None], rows].add(deltas)


@functools.partial(jax.jit, static_argnames=("num_shards",))
def pack_quantized_pages(stored: Shaped[Array, "num_pages page_size kv_heads_x2 row_bytes"], num_shards: int = 1
                         ) -> UInt32[Array, "num_pages rows lanes"]:
    """The "quantized" interleaved pool (int8 / uint8 rows of codes and a scale) as the packed quantized layout of
    `num_shards` shards (a full copy: tests, tools)."""
    num_pages, page_size, kv_heads_x2, row_bytes = stored.shape
    layout = QuantizedPackedLayout(kv_heads_x2 // 2, row_bytes - SCALE_BYTES, format_of_pool(stored.dtype),
                                   page_size)
    shape, dtype = packed_quantized_shape(num_pages, page_size, layout.num_kv_heads, layout.head_dim,
                                          layout.kv_format, num_shards)
    slots = jnp.arange(num_pages * page_size)
    return write_packed_quantized_rows(jnp.zeros(shape, dtype), stored.reshape(-1, kv_heads_x2, row_bytes), slots,
                                       layout, num_shards)


@functools.partial(jax.jit, static_argnames=("num_kv_heads", "head_dim", "kv_cache_dtype", "page_size", "num_shards"))
def unpack_quantized_pages(words: UInt32[Array, "num_pages rows lanes"], num_kv_heads: int, head_dim: int,
                           kv_cache_dtype: str, page_size: int, num_shards: int = 1
                           ) -> Shaped[Array, "num_pages page_size kv_heads_x2 row_bytes"]:
    """Inverse of pack_quantized_pages: the quantized rows (int8 or uint8, codes then scale bytes)."""
    if num_shards > 1:
        return jnp.concatenate([unpack_quantized_pages(part, num_kv_heads // num_shards, head_dim, kv_cache_dtype,
                                                       page_size)
                                for part in jnp.split(words, num_shards, axis=1)], axis=2)
    layout = quantized_layout_for(num_kv_heads, head_dim, kv_cache_dtype, page_size)
    num_pages = words.shape[0]
    quads = words[:, :layout.code_rows].reshape(num_pages, page_size // QUAD, 1, layout.vectors_per_token, LANES)
    codes = (quads >> (8 * jnp.arange(QUAD, dtype=jnp.uint32))[:, None, None]) & 0xFF  # [pages, quads, 4, V, 128]
    vectors = codes.reshape(num_pages, page_size, layout.vectors_per_token, LANES)
    if layout.combined:
        keys, values = vectors[..., :head_dim], vectors[..., head_dim:]
    else:
        per_head = vectors.reshape(num_pages, page_size, num_kv_heads, 2, head_dim)
        keys, values = per_head[:, :, :, 0], per_head[:, :, :, 1]
    codes = jnp.stack([keys, values], axis=3).reshape(num_pages, page_size, 2 * num_kv_heads, head_dim)
    scale_words = words[:, layout.code_rows:layout.code_rows + layout.scale_rows].reshape(num_pages, -1)
    scale_words = scale_words[:, :page_size * num_kv_heads].reshape(num_pages, page_size, num_kv_heads)
    scales = jnp.stack([scale_words & 0xFFFF, scale_words >> 16], axis=3).reshape(num_pages, page_size, -1)
    pool_dtype = quantized_pool_dtype(kv_cache_dtype)
    code_bytes = jax.lax.bitcast_convert_type(codes.astype(jnp.uint8), pool_dtype)
    scale_bytes = jax.lax.bitcast_convert_type(scales.astype(jnp.uint16), pool_dtype)
    return jnp.concatenate([code_bytes, scale_bytes], axis=-1)


@functools.partial(jax.jit, static_argnames=("kv_cache_dtype", "page_size", "num_shards"))
def write_kv_packed_quantized(pages: UInt32[Array, "num_pages rows lanes"],
                              k: Float[Array, "tokens num_kv_heads head_dim"],
                              v: Float[Array, "tokens num_kv_heads head_dim"], slot_mapping: Int[Array, " tokens"],
                              kv_cache_dtype: str, page_size: int, num_shards: int = 1
                              ) -> UInt32[Array, "num_pages rows lanes"]:
    """write_kv_pages' contract for the packed quantized pool: quantize the step's K / V per token and head
    (kv_quantization.quantize_rows), then merge them into their words."""
    tokens, num_kv_heads, head_dim = k.shape
    layout = quantized_layout_for(num_kv_heads, head_dim, kv_cache_dtype, page_size)
    interleaved = jnp.stack([k, v], axis=2).reshape(tokens, 2 * num_kv_heads, head_dim)
    stored = quantize_rows(interleaved, quantized_pool_dtype(layout.kv_format))
    return write_packed_quantized_rows(pages, stored, slot_mapping.astype(jnp.int32), layout, num_shards)


def bytes_per_token_table(page_sizes=(16, 128)) -> dict:
    """{(model, tp, page_size): (quantized bytes, bfloat16 packed bytes)} per token per shard (docs, tests)."""
    models = {"SmolLM2": (3, 64, 1), "Llama-3-8B tp1": (8, 128, 1), "Llama-3-8B tp8": (8, 128, 8)}
    table = {}
    for name, (heads, head_dim, tp) in models.items():
        for page_size in page_sizes:
            quantized = quantized_layout_for(heads // tp, head_dim, "int8", page_size).bytes_per_token()
            packed = packed_layout_for(heads // tp, head_dim, jnp.bfloat16)
            table[(name, page_size)] = (quantized, packed.rows_per_token * LANES * 4)
    return table
