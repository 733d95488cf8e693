"""In-kernel reads of the packed quantized KV layout (kv_layout_quantized.py): codes to float32, times the scale.

Both TPU kernels DMA whole pages into their VMEM buffer ([pages * page_rows, 128] uint32) exactly as for the bfloat16
packed layout; then for n tokens = whole pages starting at a page boundary:
  - quad i of vector v of every page is one sublane-strided load (start i * V + v, stride page_rows): [pages, 128]
    words, whose byte j is token 4i + j of each page;
  - a byte becomes float32 by shifts only: int8 sign-extends with an arithmetic shift, fp8 (e4m3fn) is rebuilt as
    float32 bits (exponent + 120, mantissa << 20; subnormals m * 2^-9), so nothing needs an 8-bit vector type;
  - the scales of token t of every page are one lane of the page's scale row ([pages, 1], bfloat16 bits << 16 is
    float32), broadcast over the token's 128 lanes;
  - the page_size pieces of [pages, 128] are stacked on sublanes: row t * pages + p is token t of page p, the order
    token_offsets gives the kernels' masks.
"""

from typing import Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.kv_layout_quantized import QUAD, QuantizedPackedLayout
from pallas_kernels.ragged_paged_attention.vector_order import LANES


def token_offsets(layout, shape: tuple, dimension: int, num_tokens: int) -> jax.Array:
    """int32 iota over `dimension` of `shape` giving each row's token offset in its slice of num_tokens tokens:
    the identity for the other layouts, the page-minor order of load_head_quantized for this one."""
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, dimension)
    if not isinstance(layout, QuantizedPackedLayout):
        return rows
    pages = num_tokens // layout.page_size
    return (rows % pages) * layout.page_size + rows // pages


def _byte_to_float(words: jax.Array, byte: int, kv_format: str) -> jax.Array:
    """Byte `byte` of each uint32 word as the float32 its 8-bit code stands for (before the scale)."""
    if kv_format == "int8":
        signed = pltpu.bitcast(words << jnp.uint32(24 - 8 * byte), jnp.int32) >> 24  # arithmetic: sign-extends
        return signed.astype(jnp.float32)
    bits = (words >> jnp.uint32(8 * byte)) & jnp.uint32(0xFF)
    sign = (bits >> 7) << 31
    exponent = (bits >> 3) & jnp.uint32(0xF)
    mantissa = bits & jnp.uint32(0x7)
    normal = pltpu.bitcast(sign | ((exponent + jnp.uint32(120)) << 23) | (mantissa << 20), jnp.float32)
    subnormal = mantissa.astype(jnp.int32).astype(jnp.float32) * (2.0 ** -9)
    subnormal = jnp.where(sign > 0, -subnormal, subnormal)
    return jnp.where(exponent == 0, subnormal, normal)


def _scale_columns(buf_ref, slot, base, head: int, layout: QuantizedPackedLayout, pages: int):
    """[(K scale, V scale)] per token of the page, each [pages, 1] float32."""
    rows = {}
    columns = []
    for token in range(layout.page_size):
        word = token * layout.num_kv_heads + head
        row, lane = divmod(word, LANES)
        if row not in rows:
            rows[row] = buf_ref[slot, pl.ds(base + layout.code_rows + row, pages, stride=layout.page_rows), :]
        bits = rows[row][:, lane:lane + 1]
        columns.append((pltpu.bitcast(bits << jnp.uint32(16), jnp.float32),
                        pltpu.bitcast(bits & jnp.uint32(0xFFFF0000), jnp.float32)))
    return columns


def _load_vector(buf_ref, slot, base, vector: int, layout: QuantizedPackedLayout, pages: int, scales) -> jax.Array:
    """Vector `vector` of the slice's tokens, dequantized, [page_size * pages, 128] float32 (page-minor)."""
    pieces = []
    lanes = jax.lax.broadcasted_iota(jnp.int32, (pages, LANES), 1)
    for quad in range(layout.page_size // QUAD):
        start = base + quad * layout.vectors_per_token + vector
        words = buf_ref[slot, pl.ds(start, pages, stride=layout.page_rows), :]
        for byte in range(QUAD):
            key_scale, value_scale = scales[quad * QUAD + byte]
            if layout.combined:  # [K | V]: K's scale on lanes 0..63, V's on 64..127
                scale = jnp.where(lanes < layout.head_dim, key_scale, value_scale)
            else:
                scale = key_scale if vector // layout.lane_tiles % 2 == 0 else value_scale
            pieces.append(_byte_to_float(words, byte, layout.kv_format) * scale)
    return jnp.concatenate(pieces, axis=0)


def load_head_quantized(buf_ref, slot, head: int, layout: QuantizedPackedLayout, num_tokens: int,
                        first_token: Union[int, jax.Array] = 0):
    """(keys, values) of one KV head, float32 [num_tokens, lanes] each, for tokens first_token.. of the slot (whole
    pages, page-minor order: token_offsets). head_dim 64: keys and values are the same dequantized [K | V] vector."""
    pages = num_tokens // layout.page_size
    base = first_token // layout.page_size * layout.page_rows
    scales = _scale_columns(buf_ref, slot, base, head, layout, pages)
    vectors = {i: _load_vector(buf_ref, slot, base, i, layout, pages, scales)
               for i in sorted(set(layout.key_vectors(head) + layout.value_vectors(head)))}
    join = lambda indices: (vectors[indices[0]] if len(indices) == 1  # noqa: E731
                            else jnp.concatenate([vectors[i] for i in indices], axis=1))
    return join(layout.key_vectors(head)), join(layout.value_vectors(head))
