"""VMEM budgets of the TPU kernels: the chip's scoped-VMEM limit, and decode blocks sized to fit it.

Mosaic places a kernel's scratch (the KV double buffer, the online-softmax state) *and* its large
intermediate vectors (a chunk's keys, values, logits, masks) in scoped VMEM, under the limit the
pallas_call asks for. The chip's capacity comes from Pallas (`pltpu.get_tpu_info()`, which reads the
default device: a TPU, or a TPU topology's device when compiling ahead of time on a CPU). Interpret
mode on a CPU has no chip: the smallest capacity of the chips this engine targets stands in.

Decode is the kernel whose buffer is big (MiBs per DMA block), so its plan is explicit: the compute
walks a block in chunks of `DECODE_COMPUTE_TOKENS`, which bounds the intermediates whatever the block
size; the block gets what the limit leaves after them, capped at `DEFAULT_BLOCK_BYTES` (4 MiB DMAs
already stream at full HBM bandwidth).

The tile kernel (prefill chunks) wants MXU-sized blocks: `PREFILL_Q_TOKENS` q rows (times the GQA group: 1k-row
operands for Llama) against `PREFILL_KV_TOKENS` of KV per step, halved (KV first) until the estimate fits the
limit. libtpu compiles 256 x 1024 at every shape of docs/tpu-compile.md on v5e and v6e (bfloat16 and float32).
"""

from typing import Optional, Union

import jax.numpy as jnp

from pallas_kernels.ragged_paged_attention.kv_layout_packed import PackedLayout
from pallas_kernels.ragged_paged_attention.kv_layout_quantized import QuantizedPackedLayout
from pallas_kernels.ragged_paged_attention.vector_order import LANES

KernelLayout = Optional[Union[PackedLayout, QuantizedPackedLayout]]
"""The layout the kernels read pages with: None for interleaved."""

# v7x has 64 MiB per core, v5e / v6e 128 MiB: a device Pallas cannot name gets the smallest.
FALLBACK_VMEM_CAPACITY_BYTES = 64 * 1024 * 1024
# Mosaic's internal scratch and XLA's fusions around the kernel share VMEM: leave them a quarter.
VMEM_LIMIT_FRACTION = 0.75
DEFAULT_BLOCK_BYTES = 4 * 1024 * 1024
DECODE_COMPUTE_TOKENS = 256
# Scoped-VMEM bytes of intermediates per (compute token, KV head, lane of head_dim), from libtpu's
# scoped-VMEM reports (docs/tpu-compile.md): keys and values as loaded, masked values, the int32 position
# iota and its mask: ~24 bytes measured with the interleaved layout on v5e (its sublane-strided loads relayout),
# under 2 with the packed one; 32 leaves slack.
_INTERMEDIATE_BYTES = 32
PREFILL_Q_TOKENS = 256
PREFILL_KV_TOKENS = 1024
# float32 [q rows x KV tokens] arrays a tile-kernel step keeps live (logits, probabilities, mask, positions): an
# estimate with slack, as _INTERMEDIATE_BYTES is for decode.
_TILE_INTERMEDIATE_ARRAYS = 8


def vmem_capacity_bytes() -> int:
    """VMEM bytes per TensorCore of the default device's chip (the fallback where it is not a TPU)."""
    # Mosaic's TPU module, loaded only when the chip is asked (the rest of this module is plain arithmetic).
    from jax.experimental.pallas import tpu as pltpu

    try:
        return int(pltpu.get_tpu_info().vmem_capacity_bytes)
    except (ValueError, NotImplementedError, RuntimeError):
        return FALLBACK_VMEM_CAPACITY_BYTES


def default_vmem_limit_bytes() -> int:
    """The scoped-VMEM limit the kernels ask for on the default device's chip."""
    return int(vmem_capacity_bytes() * VMEM_LIMIT_FRACTION)


def _packing(dtype) -> int:
    return 4 // jnp.dtype(dtype).itemsize


def token_bytes(kv_heads_x2: int, head_dim: int, dtype, layout: KernelLayout) -> int:
    """VMEM bytes one token's K/V takes in the kernels' buffer: interleaved rows are tiled (sublanes x 128
    lanes, padded), packed rows are whole uint32 words."""
    if isinstance(layout, PackedLayout):
        return layout.rows_per_token * LANES * 4
    if layout is not None:  # packed quantized (kv_layout_quantized.py): a page's rows over its tokens
        return -(-layout.page_rows * LANES * 4 // layout.page_size)
    sublanes = 8 * _packing(dtype)
    return -(-kv_heads_x2 // sublanes) * sublanes * (-(-head_dim // LANES) * LANES) * jnp.dtype(dtype).itemsize


def decode_compute_pages(page_size: int, pages_per_block: int) -> int:
    """Pages the decode kernel attends per inner step: the largest divisor of the block that keeps the
    chunk within DECODE_COMPUTE_TOKENS (at least one page)."""
    target = max(1, DECODE_COMPUTE_TOKENS // page_size)
    return max(pages for pages in range(1, min(target, pages_per_block) + 1) if pages_per_block % pages == 0)


def decode_intermediate_bytes(num_kv_heads: int, head_dim: int, compute_tokens: int) -> int:
    """Scoped VMEM the decode kernel's intermediates take for one compute chunk (an estimate, see above)."""
    return num_kv_heads * compute_tokens * (-(-head_dim // LANES) * LANES) * _INTERMEDIATE_BYTES


def decode_pages_per_block(page_size: int, pages_per_seq: int, num_kv_heads: int, head_dim: int, dtype,
                           layout: KernelLayout, vmem_limit_bytes: int,
                           block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    """Pages per decode DMA block: two blocks and a compute chunk's intermediates within the VMEM limit,
    at most block_bytes each, whole compute chunks, never more than a sequence can own."""
    per_page = page_size * token_bytes(2 * num_kv_heads, head_dim, dtype, layout)
    compute_pages = max(1, DECODE_COMPUTE_TOKENS // page_size)
    spare = vmem_limit_bytes - decode_intermediate_bytes(num_kv_heads, head_dim, compute_pages * page_size)
    pages = min(pages_per_seq, min(block_bytes, spare // 2) // per_page)
    if pages > compute_pages:
        pages -= pages % compute_pages
    return max(1, pages)


def vmem_bytes(num_q_heads, kv_heads_x2, head_dim, dtype, *, q_block_size, chunk_tokens, layout=None,
               intermediate_bytes: int = 0) -> int:
    """VMEM one grid step holds: KV double buffer, q/out tiles (double-buffered), f32 state, intermediates."""
    itemsize = jnp.dtype(dtype).itemsize
    kv = 2 * chunk_tokens * token_bytes(kv_heads_x2, head_dim, dtype, layout)
    q_and_out = 2 * 2 * num_q_heads * q_block_size * max(head_dim, LANES) * itemsize
    state = num_q_heads * q_block_size * (max(head_dim, LANES) + 2 * LANES) * 4
    return kv + q_and_out + state + intermediate_bytes


def prefill_blocks(num_tokens: int, page_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype,
                   layout: KernelLayout, vmem_limit_bytes: int) -> tuple[int, int]:
    """(q_block_size, pages_per_chunk) of the tile kernel: up to PREFILL_Q_TOKENS rows (no more than the step's
    tokens, whole sublane tiles) against up to PREFILL_KV_TOKENS of KV (whole pages), within the VMEM limit."""
    sublanes = 8 * _packing(dtype)
    q_block = min(PREFILL_Q_TOKENS, -(-num_tokens // sublanes) * sublanes)
    pages = max(1, PREFILL_KV_TOKENS // page_size)
    group = num_q_heads // num_kv_heads

    def fits(q_block: int, pages: int) -> bool:
        intermediates = group * q_block * pages * page_size * 4 * _TILE_INTERMEDIATE_ARRAYS
        return vmem_bytes(num_q_heads, 2 * num_kv_heads, head_dim, dtype, q_block_size=q_block,
                          chunk_tokens=pages * page_size, layout=layout,
                          intermediate_bytes=intermediates) <= vmem_limit_bytes

    while not fits(q_block, pages) and (pages > 1 or q_block > sublanes):
        if pages > 1 and pages * page_size >= q_block:
            pages //= 2
        else:
            q_block = max(sublanes, q_block // 2 // sublanes * sublanes)
    return q_block, pages
