"""The TPU decode case: one grid step per sequence, its q head group as the MXU operand, big live DMAs.

Used (through tpu.py's switch) for steps where every real sequence brings exactly one token. The
general tile kernel would spend a 32-row q tile per sequence there, 31 rows of it masked; here a
sequence's rows are only its q heads: per KV head one [group_size, head_dim] operand.

Memory traffic, the whole cost of decode:
  - KV streams in blocks of `pages_per_block` pages (up to 4 MiB per block, sized from the chip's VMEM by
    tpu_vmem.decode_pages_per_block), one async copy per page, all on one DMA semaphore; only pages below
    kv_len are started, and one wait with a descriptor covering exactly the started bytes retires them all.
  - A block is attended in compute chunks of ~256 tokens (a fori_loop): Mosaic keeps a chunk's keys, values
    and masks in scoped VMEM, so unrolling over a 1k-token block overflowed v5e's limit (issue 40).
  - Blocks are double-buffered across sequences: the grid axis is sequential ("arbitrary") and the
    buffer slot lives in SMEM scratch, so the last block of sequence s overlaps the first DMA of s+1.
  - Page ids are clamped into the block table row, so bounds checks are disabled.
Sliding windows: a sequence's blocks start at the page holding its window's first token (not at a block boundary),
so the pages before it, which the scheduler may have freed and handed to another request, are never fetched, and a
decode reads about window / page_size pages whatever its length. Attention sinks (gpt-oss) join each row's sum after
its last block (tpu_online_softmax.fold_sinks).
Sequences past num_seqs do nothing; their q/out blocks map onto the last real sequence's token, so
the pipeline neither fetches nor writes anything new for them.
"""

import functools
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float, Int, UInt32

from pallas_kernels.ragged_paged_attention.kv_layout_packed import PackedLayout
from pallas_kernels.ragged_paged_attention.kv_layout_quantized import QuantizedPackedLayout
from pallas_kernels.ragged_paged_attention.metadata import MASK_VALUE
from pallas_kernels.ragged_paged_attention.tpu_kv_reads import kv_scratch_shape, load_head
from pallas_kernels.ragged_paged_attention.tpu_kv_reads import page_rows as kv_page_rows
from pallas_kernels.ragged_paged_attention.tpu_online_softmax import accumulate_head, fold_sinks
from pallas_kernels.ragged_paged_attention.tpu_quantized_kv import token_offsets
from pallas_kernels.ragged_paged_attention.tpu_vmem import decode_compute_pages

_LANES = 128


def _kernel(num_seqs_ref, kv_lens_ref, tables_ref, cu_q_lens_ref,  # scalar prefetch (SMEM)
            q_ref, kv_hbm_ref,  # q block of this sequence's token (VMEM); all pages (HBM)
            *refs,  # [sinks (VMEM, with sinks)], out, then the scratch
            sm_scale, sliding_window, soft_cap, pages_per_block, pages_per_seq, page_size, layout, has_sinks):
    del cu_q_lens_ref  # only the BlockSpec index maps read it
    sinks_ref, refs = (refs[0], refs[1:]) if has_sinks else (None, refs)
    out_ref, kv_buf, sems, slot_ref, max_ref, sum_ref, acc_ref = refs
    _, num_kv_heads, group_size, head_dim = q_ref.shape  # head_dim: 128 lanes for packed head_dim 64
    block_tokens = pages_per_block * page_size
    page_rows = kv_page_rows(layout, page_size)
    seq = pl.program_id(0)
    num_seqs = num_seqs_ref[0]
    max_num_seqs = kv_lens_ref.shape[0]

    def first_page(s):
        """The page of the first token sequence s's row sees: its window's start (0 without a window)."""
        if sliding_window is None:
            return 0
        return jnp.maximum(kv_lens_ref[jnp.minimum(s, max_num_seqs - 1)] - sliding_window, 0) // page_size

    def block_range(s):
        """[0, end) KV blocks sequence s reads, counted from its first_page."""
        kv_len = kv_lens_ref[jnp.minimum(s, max_num_seqs - 1)]
        return jnp.int32(0), jnp.maximum(kv_len - first_page(s) * page_size + block_tokens - 1, 0) // block_tokens

    def block_start(s, block):
        """The first token of block `block` of sequence s."""
        return (first_page(s) + block * pages_per_block) * page_size

    def live_pages(s, block):
        kv_len = kv_lens_ref[s]
        return jnp.clip((kv_len - block_start(s, block) + page_size - 1) // page_size, 0, pages_per_block)

    def start_fetch(s, block, slot):
        def start_page(i, _):
            page = jnp.minimum(first_page(s) + block * pages_per_block + i, pages_per_seq - 1)
            pltpu.make_async_copy(kv_hbm_ref.at[tables_ref[s * pages_per_seq + page]],
                                  kv_buf.at[slot, pl.ds(i * page_rows, page_rows)], sems.at[slot]).start()
            return ()
        jax.lax.fori_loop(0, live_pages(s, block), start_page, ())

    def wait_fetch(s, block, slot):
        # One wait for every page of the block: the descriptor's size is the bytes started.
        started = kv_buf.at[slot, pl.ds(0, live_pages(s, block) * page_rows)]
        pltpu.make_async_copy(started, started, sems.at[slot]).wait()

    @pl.when(seq == 0)
    def _prime():
        slot_ref[0] = 0
        first, end = block_range(0)

        @pl.when((num_seqs > 0) & (first < end))
        def _fetch_first():
            start_fetch(0, first, 0)

    precision = jax.lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else None
    compute_tokens = decode_compute_pages(page_size, pages_per_block) * page_size
    # Token offsets of a chunk's key rows (the packed quantized layout reads them page-minor: tpu_quantized_kv.py).
    offsets = token_offsets(layout, (group_size, compute_tokens), 1, compute_tokens)
    value_offsets = token_offsets(layout, (compute_tokens, head_dim), 0, compute_tokens)

    def attend_block(block, slot):
        # The block is walked in compute chunks (a fori_loop, not unrolled): the intermediates are one
        # chunk's whatever the block's size, and chunks past kv_len are skipped.
        kv_len = kv_lens_ref[seq]
        start = block_start(seq, block)
        num_chunks = jnp.clip((kv_len - start + compute_tokens - 1) // compute_tokens, 0,
                              block_tokens // compute_tokens)

        def attend_chunk(chunk, carry):
            first = pl.multiple_of(chunk * compute_tokens, compute_tokens)
            positions = start + first + offsets
            mask = positions < kv_len
            if sliding_window is not None:
                mask &= positions >= kv_len - sliding_window
            value_is_real = start + first + value_offsets < kv_len  # stale VMEM may hold NaNs
            for head in range(num_kv_heads):
                keys, values = load_head(kv_buf, slot, head, layout, compute_tokens, first, q_ref.dtype)
                accumulate_head(q_ref[0, head], keys, values, mask, value_is_real, head, max_ref, sum_ref,
                                acc_ref, sm_scale=sm_scale, soft_cap=soft_cap, precision=precision)
            return carry

        jax.lax.fori_loop(0, num_chunks, attend_chunk, ())

    @pl.when(seq < num_seqs)
    def _attend_sequence():
        max_ref[...] = jnp.full(max_ref.shape, MASK_VALUE, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        first, end = block_range(seq)
        next_first, next_end = block_range(seq + 1)
        next_is_real = (seq + 1 < num_seqs) & (next_first < next_end)

        def step(block, slot):
            more = block + 1 < end

            @pl.when(more)
            def _prefetch_own_block():
                start_fetch(seq, block + 1, 1 - slot)

            @pl.when(jnp.logical_not(more) & next_is_real)
            def _prefetch_next_sequence():
                start_fetch(seq + 1, next_first, 1 - slot)

            wait_fetch(seq, block, slot)
            attend_block(block, slot)
            return 1 - slot

        slot_ref[0] = jax.lax.fori_loop(first, end, step, slot_ref[0])

        @pl.when((first >= end) & next_is_real)  # nothing to read (kv_len 0): keep the chain going
        def _fetch_for_next_sequence():
            start_fetch(seq + 1, next_first, slot_ref[0])

        for head in range(num_kv_heads):
            if sinks_ref is not None:
                fold_sinks(sinks_ref, head, 1, max_ref, sum_ref, acc_ref)
            row_sums = sum_ref[head][:, :1]
            out = acc_ref[head] / jnp.where(row_sums > 0, row_sums, 1.0)
            out_ref[0, head] = out.astype(out_ref.dtype)


def ragged_paged_attention_tpu_decode(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    kv_pages: Union[Float[Array, "num_pages page_size kv_heads_x2 head_dim"], UInt32[Array, "num_pages rows lanes"]],
    kv_lens: Int[Array, " max_num_seqs"],
    block_tables: Int[Array, "max_num_seqs pages_per_seq"],
    cu_q_lens: Int[Array, " max_num_seqs_plus_1"],
    num_seqs: Int[Array, " 1"],
    *,
    sm_scale: float,
    sliding_window: Optional[int],
    soft_cap: Optional[float],
    pages_per_block: int,
    page_size: int,
    layout: Optional[Union[PackedLayout, QuantizedPackedLayout]],
    interpret: Union[bool, pltpu.InterpretParams],
    vmem_limit_bytes: int,
    sinks: Optional[Float[Array, " num_q_heads"]] = None,
) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """Decode-only attention (every real sequence has one q row); rows of no sequence are garbage. sinks: one logit
    per q head in the softmax's denominator (spec.py).

    The caller (tpu.py) guarantees the decode case and zeroes rows outside every sequence.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    max_num_seqs, pages_per_seq = block_tables.shape
    num_kv_heads = kv_pages.shape[2] // 2 if layout is None else layout.num_kv_heads
    group_size = num_q_heads // num_kv_heads
    block_tokens = pages_per_block * page_size

    def token_block(seq, num_seqs_ref, kv_lens_ref, tables_ref, cu_q_lens_ref):
        # Dead sequences reuse the last real sequence's block: no new fetch, no new write-back.
        last_real = jnp.maximum(jnp.minimum(seq, num_seqs_ref[0] - 1), 0)
        return jnp.minimum(cu_q_lens_ref[last_real], num_tokens - 1), 0, 0, 0

    block_spec = pl.BlockSpec((1, num_kv_heads, group_size, head_dim), token_block)
    kernel = functools.partial(_kernel, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
                               pages_per_block=pages_per_block, pages_per_seq=pages_per_seq, page_size=page_size,
                               layout=layout, has_sinks=sinks is not None)
    in_specs = [block_spec, pl.BlockSpec(memory_space=pl.ANY)]
    inputs = [q.reshape(num_tokens, num_kv_heads, group_size, head_dim), kv_pages]
    if sinks is not None:  # a few scalars: SMEM
        in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
        inputs.append(sinks.astype(jnp.float32))
    buf_shape, buf_dtype = kv_scratch_shape(layout, block_tokens, 2 * num_kv_heads, head_dim, kv_pages.dtype,
                                            page_size)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(max_num_seqs,),
            in_specs=in_specs,
            out_specs=block_spec,
            scratch_shapes=[
                pltpu.VMEM(buf_shape, buf_dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SMEM((1,), jnp.int32),
                pltpu.VMEM((num_kv_heads, group_size, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, group_size, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, group_size, head_dim), jnp.float32),
            ]),
        out_shape=jax.ShapeDtypeStruct((num_tokens, num_kv_heads, group_size, head_dim), q.dtype),
        # Sequential: a step's DMA is waited on by the next step (cross-sequence double buffering).
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=vmem_limit_bytes, disable_bounds_checks=True),
        interpret=interpret,
        name="ragged_paged_attention_tpu_decode",
    )(num_seqs, kv_lens, block_tables.reshape(-1), cu_q_lens, *inputs)
    return out.reshape(num_tokens, num_q_heads, head_dim)
