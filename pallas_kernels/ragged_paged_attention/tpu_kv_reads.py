"""In-kernel reads of the KV pages (Mosaic): both TPU kernels size their VMEM buffers and load a head's keys and
values through these, whatever the layout (interleaved, packed: kv_layout_packed.py, or packed quantized:
kv_layout_quantized.py, dequantized by tpu_quantized_kv.py). A layout here is kv_layout.kernel_layout's: None for
interleaved, a PackedLayout or a QuantizedPackedLayout.
"""

from typing import Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.kv_layout_packed import PackedLayout
from pallas_kernels.ragged_paged_attention.tpu_quantized_kv import load_head_quantized
from pallas_kernels.ragged_paged_attention.vector_order import LANES


def page_rows(layout, page_size: int) -> int:
    """Rows along the VMEM buffer's axis 1 per page: page_size for interleaved ([tokens, 2kv, d] buffers), word rows
    for the packed layouts (the quantized one's page_rows: kv_layout_quantized.py)."""
    if layout is None:
        return page_size
    if isinstance(layout, PackedLayout):
        return page_size * layout.rows_per_token
    return layout.page_rows


def kv_scratch_shape(layout, block_tokens: int, kv_heads_x2: int, head_dim: int, dtype, page_size: int):
    """(shape, dtype) of the double-buffered VMEM block both kernels DMA pages into."""
    if layout is None:
        return (2, block_tokens, kv_heads_x2, head_dim), dtype
    return (2, block_tokens // page_size * page_rows(layout, page_size), LANES), jnp.uint32


def load_vector(buf_ref, slot, index: int, layout: PackedLayout, num_tokens: int,
                first_token: Union[int, jax.Array] = 0):
    """Vector `index` of tokens first_token.. of the slot: one sublane-strided uint32 load, then its half."""
    first_row = first_token * layout.rows_per_token + index // layout.packing
    rows = buf_ref[slot, pl.ds(first_row, num_tokens, stride=layout.rows_per_token), :]
    if layout.packing == 1:
        return pltpu.bitcast(rows, jnp.float32)
    half = rows >> 16 if index % 2 else rows & jnp.uint32(0xFFFF)
    return pltpu.bitcast(half.astype(jnp.uint16), jnp.bfloat16)


def load_head(buf_ref, slot, head: int, layout, num_tokens: int, first_token: Union[int, jax.Array], dtype):
    """(keys, values) of one KV head for tokens first_token..first_token + num_tokens of the slot, [num_tokens,
    lanes] each in `dtype` (q's: a quantized page dequantizes to float32 first); first_token may be traced (the
    kernels walk a DMA block in compute chunks).

    Interleaved: sublane 2h / 2h + 1 of the [tokens, 2kv, d] buffer. Packed with head_dim 64: keys and
    values are the same [K | V] vector (q is zero-padded past lane 64, the output read from lane 64).
    """
    if layout is not None and not isinstance(layout, PackedLayout):  # packed quantized: dequantized float32
        keys, values = load_head_quantized(buf_ref, slot, head, layout, num_tokens, first_token)
    elif layout is None:
        tokens = pl.ds(first_token, num_tokens)
        keys, values = buf_ref[slot, tokens, 2 * head, :], buf_ref[slot, tokens, 2 * head + 1, :]
    else:
        vectors = {i: load_vector(buf_ref, slot, i, layout, num_tokens, first_token)
                   for i in sorted(set(layout.key_vectors(head) + layout.value_vectors(head)))}
        join = lambda indices: (vectors[indices[0]] if len(indices) == 1  # noqa: E731
                                else jnp.concatenate([vectors[i] for i in indices], axis=1))
        keys, values = join(layout.key_vectors(head)), join(layout.value_vectors(head))
    return keys.astype(dtype), values.astype(dtype)
