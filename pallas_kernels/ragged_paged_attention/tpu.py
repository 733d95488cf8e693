"""Ragged paged attention as a TPU Mosaic kernel: pages stream from HBM into VMEM, double-buffered.

Grid: one step per tile of `q_block_size` q rows (token axis). A tile may hold rows of several
sequences (decodes) or a slice of one long prefill; the step walks the (sequence, KV chunk) pairs its
rows need as one flat list, so the DMA of the next chunk — possibly of the next sequence — is in
flight while the current one is multiplied. Rows of other sequences are masked, which leaves their
online-softmax state untouched, so one accumulator serves the whole tile.

Hardware notes (why the shapes are what they are):
  - q is laid out [num_kv_heads, group_size, tokens, head_dim] so a tile's (tokens, head_dim) are the
    (sublane, lane) dims, and all q heads of one KV head form one [group_size * q_block_size,
    head_dim] MXU operand: GQA reads each K/V chunk once per tile, never once per q head.
  - Pages stay in HBM (memory_space ANY); one DMA per page copies the whole contiguous
    [page_size, 2 * num_kv_heads, head_dim] page into a VMEM slot of the same layout (big DMAs, no
    relayout of the cache: reshaping the cache in HBM would copy it whenever 2 * num_kv_heads is
    not a multiple of the sublane tile). K / V of head h are then sublane 2h / 2h+1 of every
    (heads, head_dim) tile: one sublane-strided load each.
  - bfloat16 packs rows 2h and 2h+1 into one 32-bit sublane. If Mosaic rejects the packed
    strided load on some chip, read the slot as uint32 and split halves with shifts; the TPU
    interpreter cannot run ref bitcasts, so that variant cannot be tested on CPU.
  - Running max and sum are kept lane-replicated ([rows, 128]) to avoid unaligned 1-lane slices.
Pages past a sequence's length are not fetched; their stale VMEM is masked out of logits and V.
"""

import functools
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float

from pallas_kernels.ragged_paged_attention.metadata import MASK_VALUE, AttentionMetadata

_LANES = 128
DEFAULT_Q_BLOCK_SIZE = 32
DEFAULT_KV_CHUNK_TOKENS = 128  # one lane-width of logits per chunk
DEFAULT_VMEM_LIMIT_BYTES = 32 * 1024 * 1024


def _packing(dtype) -> int:
    return 4 // jnp.dtype(dtype).itemsize


def _kernel(kv_lens_ref, tables_ref, cu_q_lens_ref, tile_seqs_ref,  # scalar prefetch (SMEM)
            q_ref, kv_hbm_ref,  # inputs: q tile in VMEM, all pages in HBM
            out_ref,  # output tile
            kv_buf, sems, max_ref, sum_ref, acc_ref,  # scratch
            *, sm_scale, sliding_window, soft_cap, pages_per_chunk, pages_per_seq):
    num_kv_heads, group_size, q_block_size, head_dim = q_ref.shape
    chunk_tokens = kv_buf.shape[1]
    page_size = chunk_tokens // pages_per_chunk
    num_rows = group_size * q_block_size
    max_num_seqs = kv_lens_ref.shape[0]
    tile = pl.program_id(0)
    tile_start = tile * q_block_size
    first_seq, end_seq = tile_seqs_ref[2 * tile], tile_seqs_ref[2 * tile + 1]

    def chunk_range(seq):
        """[first, end) KV chunks the tile's rows of `seq` attend to (at least one chunk)."""
        seq = jnp.minimum(seq, max_num_seqs - 1)
        q_start, q_end, kv_len = cu_q_lens_ref[seq], cu_q_lens_ref[seq + 1], kv_lens_ref[seq]
        first_position = kv_len - q_end + jnp.maximum(q_start, tile_start)
        last_position = kv_len - q_end + jnp.minimum(q_end, tile_start + q_block_size) - 1
        end = jnp.maximum((last_position + chunk_tokens) // chunk_tokens, 1)
        if sliding_window is None:
            return jnp.int32(0), end
        first = jnp.maximum(first_position - sliding_window + 1, 0) // chunk_tokens
        return jnp.minimum(first, end - 1), end

    def page_copies(seq, chunk, slot):
        """(needed?, descriptor) per page of the chunk; pages past kv_len are never fetched."""
        copies = []
        for i in range(pages_per_chunk):
            page = chunk * pages_per_chunk + i
            needed = page * page_size < kv_lens_ref[seq]
            page_id = tables_ref[seq * pages_per_seq + jnp.minimum(page, pages_per_seq - 1)]
            copies.append((needed, pltpu.make_async_copy(
                kv_hbm_ref.at[page_id], kv_buf.at[slot, pl.ds(i * page_size, page_size)],
                sems.at[slot])))
        return copies

    def start_fetch(seq, chunk, slot):
        for needed, copy in page_copies(seq, chunk, slot):
            pl.when(needed)(copy.start)

    def wait_fetch(seq, chunk, slot):
        for needed, copy in page_copies(seq, chunk, slot):
            pl.when(needed)(copy.wait)

    max_ref[...] = jnp.full(max_ref.shape, MASK_VALUE, jnp.float32)
    sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    # Row r of a [group_size * q_block_size, ...] operand is token r % q_block_size of the tile.
    row_tokens = tile_start + jax.lax.broadcasted_iota(
        jnp.int32, (group_size, q_block_size, chunk_tokens), 1).reshape(num_rows, chunk_tokens)
    column_offsets = jax.lax.broadcasted_iota(jnp.int32, (num_rows, chunk_tokens), 1)
    value_offsets = jax.lax.broadcasted_iota(jnp.int32, (chunk_tokens, head_dim), 0)
    # float32 caches ask the MXU for full float32 products (several bf16 passes), not one pass.
    precision = jax.lax.Precision.HIGHEST if kv_buf.dtype == jnp.float32 else None

    def attend_chunk(seq, chunk, slot):
        q_start, q_end, kv_len = cu_q_lens_ref[seq], cu_q_lens_ref[seq + 1], kv_lens_ref[seq]
        kv_positions = chunk * chunk_tokens + column_offsets
        positions = kv_len - q_end + row_tokens
        mask = (row_tokens >= q_start) & (row_tokens < q_end) & (kv_positions <= positions)
        if sliding_window is not None:
            mask &= kv_positions > positions - sliding_window
        value_is_real = chunk * chunk_tokens + value_offsets < kv_len
        for head in range(num_kv_heads):
            keys, values = kv_buf[slot, :, 2 * head, :], kv_buf[slot, :, 2 * head + 1, :]
            q = q_ref[head].reshape(num_rows, head_dim)
            logits = jax.lax.dot_general(q, keys, (((1,), (1,)), ((), ())), precision=precision,
                                         preferred_element_type=jnp.float32) * sm_scale
            if soft_cap is not None:
                logits = soft_cap * jnp.tanh(logits / soft_cap)
            logits = jnp.where(mask, logits, MASK_VALUE)
            old_max = max_ref[head]
            new_max = jnp.maximum(old_max, jnp.max(logits, axis=1, keepdims=True))
            probs = jnp.where(mask, jnp.exp(logits - new_max[:, :1]), 0.0)
            rescale = jnp.exp(old_max - new_max)
            sum_ref[head] = rescale * sum_ref[head] + jnp.sum(probs, axis=1, keepdims=True)
            max_ref[head] = new_max
            values = jnp.where(value_is_real, values, jnp.zeros_like(values))
            acc_ref[head] = acc_ref[head] * rescale[:, :1] + jax.lax.dot_general(
                probs.astype(values.dtype), values, (((1,), (0,)), ((), ())),
                precision=precision, preferred_element_type=jnp.float32)

    def next_item(seq, chunk):
        _, end = chunk_range(seq)
        more = chunk + 1 < end
        next_first, _ = chunk_range(seq + 1)
        return jnp.where(more, seq, seq + 1), jnp.where(more, chunk + 1, next_first)

    def step(carry):
        seq, chunk, slot = carry
        next_seq, next_chunk = next_item(seq, chunk)

        @pl.when(next_seq < end_seq)
        def _prefetch_next():
            start_fetch(next_seq, next_chunk, 1 - slot)

        wait_fetch(seq, chunk, slot)
        attend_chunk(seq, chunk, slot)
        return next_seq, next_chunk, 1 - slot

    first_chunk, _ = chunk_range(first_seq)

    @pl.when(first_seq < end_seq)
    def _fetch_first():
        start_fetch(first_seq, first_chunk, 0)

    jax.lax.while_loop(lambda carry: carry[0] < end_seq, step, (first_seq, first_chunk, jnp.int32(0)))

    for head in range(num_kv_heads):
        row_sums = sum_ref[head][:, :1]
        out = acc_ref[head] / jnp.where(row_sums > 0, row_sums, 1.0)  # padding rows: 0, not 0/0
        out_ref[head] = out.reshape(group_size, q_block_size, head_dim).astype(out_ref.dtype)


def _interpret_params(interpret) -> Union[bool, pltpu.InterpretParams]:
    if isinstance(interpret, pltpu.InterpretParams):
        return interpret
    return pltpu.InterpretParams() if interpret else False


def _tile_sequence_ranges(cu_q_lens, num_seqs, num_tiles: int, q_block_size: int) -> jax.Array:
    """[2 * num_tiles] int32: per q tile, the first and one-past-last sequence owning its rows."""
    max_num_seqs = cu_q_lens.shape[0] - 1
    num_real_seqs = jnp.clip(num_seqs[0], 0, max_num_seqs)
    num_real_tokens = cu_q_lens[num_real_seqs]
    seq_ends = jnp.where(jnp.arange(max_num_seqs) < num_real_seqs, cu_q_lens[1:],
                         jnp.iinfo(jnp.int32).max)
    tile_starts = jnp.arange(num_tiles, dtype=jnp.int32) * q_block_size
    last_rows = jnp.minimum(tile_starts + q_block_size, num_real_tokens) - 1
    first = jnp.searchsorted(seq_ends, tile_starts, side="right").astype(jnp.int32)
    end = jnp.searchsorted(seq_ends, last_rows, side="right").astype(jnp.int32) + 1
    end = jnp.where(tile_starts < num_real_tokens, jnp.minimum(end, num_real_seqs), first)
    return jnp.stack([first, end], axis=1).reshape(-1)


def vmem_bytes(num_q_heads, kv_heads_x2, head_dim, dtype, *, q_block_size, chunk_tokens) -> int:
    """VMEM one grid step holds: KV double buffer, q/out tiles (double-buffered), f32 state."""
    itemsize = jnp.dtype(dtype).itemsize
    sublanes = 8 * _packing(dtype)
    kv = 2 * chunk_tokens * (-(-kv_heads_x2 // sublanes) * sublanes) * max(head_dim, _LANES) * itemsize
    q_and_out = 2 * 2 * num_q_heads * q_block_size * max(head_dim, _LANES) * itemsize
    state = num_q_heads * q_block_size * (max(head_dim, _LANES) + 2 * _LANES) * 4
    return kv + q_and_out + state


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "q_block_size", "pages_per_chunk", "interpret",
    "vmem_limit_bytes"))
def ragged_paged_attention_tpu(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    kv_pages: Float[Array, "num_pages page_size kv_heads_x2 head_dim"],
    metadata: AttentionMetadata,
    *,
    sm_scale: float,
    sliding_window: Optional[int] = None,
    soft_cap: Optional[float] = None,
    q_block_size: int = DEFAULT_Q_BLOCK_SIZE,
    pages_per_chunk: Optional[int] = None,
    interpret: Union[bool, pltpu.InterpretParams] = False,
    vmem_limit_bytes: int = DEFAULT_VMEM_LIMIT_BYTES,
) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """The spec's contract on TPU; interpret=True (or InterpretParams) simulates a TPU on CPU."""
    num_tokens, num_q_heads, head_dim = q.shape
    kv_lens, block_tables, cu_q_lens, num_seqs = (metadata.kv_lens, metadata.block_tables, metadata.cu_q_lens,
                                                   metadata.num_seqs.reshape(1))
    _, page_size, kv_heads_x2, _ = kv_pages.shape
    max_num_seqs, pages_per_seq = block_tables.shape
    num_kv_heads = kv_heads_x2 // 2
    group_size = num_q_heads // num_kv_heads
    if pages_per_chunk is None:
        pages_per_chunk = max(1, DEFAULT_KV_CHUNK_TOKENS // page_size)
    sublanes = 8 * _packing(q.dtype)
    if q_block_size % sublanes:
        raise ValueError(f"q_block_size: must be a multiple of {sublanes} for {q.dtype}, "
                         f"got {q_block_size}")
    if page_size % (8 * _packing(kv_pages.dtype)):
        raise ValueError(f"kv_pages: page_size must be a multiple of "
                         f"{8 * _packing(kv_pages.dtype)} on TPU, got {page_size}")
    chunk_tokens = pages_per_chunk * page_size
    needed = vmem_bytes(num_q_heads, kv_heads_x2, head_dim, kv_pages.dtype,
                        q_block_size=q_block_size, chunk_tokens=chunk_tokens)
    if needed > vmem_limit_bytes:
        raise ValueError(f"q_block_size/pages_per_chunk: need {needed} bytes of VMEM, over "
                         f"vmem_limit_bytes={vmem_limit_bytes}; use smaller blocks")

    num_tiles = -(-num_tokens // q_block_size)
    padded_tokens = num_tiles * q_block_size
    # [tokens, q heads, d] -> [kv heads, group, tokens, d]: tokens on sublanes, a KV head's q heads
    # stacked into one matmul operand.
    q_tiles = jnp.pad(q, ((0, padded_tokens - num_tokens), (0, 0), (0, 0))).reshape(
        padded_tokens, num_kv_heads, group_size, head_dim).transpose(1, 2, 0, 3)
    tile_seqs = _tile_sequence_ranges(cu_q_lens, num_seqs, num_tiles, q_block_size)
    tile_spec = pl.BlockSpec((num_kv_heads, group_size, q_block_size, head_dim),
                             lambda tile, *_: (0, 0, tile, 0))
    kernel = functools.partial(
        _kernel, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
        pages_per_chunk=pages_per_chunk, pages_per_seq=pages_per_seq)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(num_tiles,),
            in_specs=[tile_spec, pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=tile_spec,
            scratch_shapes=[
                pltpu.VMEM((2, chunk_tokens, kv_heads_x2, head_dim), kv_pages.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((num_kv_heads, group_size * q_block_size, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, group_size * q_block_size, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, group_size * q_block_size, head_dim), jnp.float32),
            ]),
        out_shape=jax.ShapeDtypeStruct(q_tiles.shape, q.dtype),
        # Tiles share nothing (each fetches its own first chunk), so megacore may split them.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=vmem_limit_bytes),
        interpret=_interpret_params(interpret),
        name="ragged_paged_attention_tpu",
    )(kv_lens, block_tables.reshape(-1), cu_q_lens, tile_seqs, q_tiles, kv_pages)
    return out.transpose(2, 0, 1, 3).reshape(padded_tokens, num_q_heads, head_dim)[:num_tokens]
