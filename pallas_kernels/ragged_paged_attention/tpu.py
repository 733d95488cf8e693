"""Ragged paged attention on TPU (Mosaic): the per-step switch, and the general tile kernel.

ragged_paged_attention_tpu splits each step by case (tpu_step_cases.py, one lax.switch) over two statically
shaped kernels: tpu_decode.py for sequences with exactly one q row (a sequence's rows are its q head group, KV in
multi-page live-only DMA blocks), the tile kernel below for prefill chunks; a mixed step runs its leading decodes
through the first and the rest through the second. Both scalar-prefetch the block table into SMEM;
sequences_per_call checks the estimate against a budget and runs an oversized step as several calls over sequence
ranges.

Tile kernel grid: one step per tile of `q_block_size` q rows (token axis). A tile may hold rows of several
sequences (decodes) or a slice of one long prefill; the step walks the (sequence, KV chunk) pairs its
rows need as one flat list, so the DMA of the next chunk — possibly of the next sequence — is in
flight while the current one is multiplied. Rows of other sequences are masked, which leaves their
online-softmax state untouched, so one accumulator serves the whole tile.

Hardware notes (why the shapes are what they are):
  - q is laid out [num_kv_heads, group_size, tokens, head_dim] so a tile's (tokens, head_dim) are the
    (sublane, lane) dims, and all q heads of one KV head form one [group_size * q_block_size,
    head_dim] MXU operand: GQA reads each K/V chunk once per tile, never once per q head.
  - Pages stay in HBM (memory_space ANY); one DMA per page copies the whole contiguous page into a
    VMEM slot of the same layout (no relayout of the cache in HBM).
  - Two cache layouts (kv_layout.py). Interleaved [page_size, 2 * num_kv_heads, head_dim]: K / V of
    head h are sublane 2h / 2h+1 of each token's (heads, head_dim) tile, which TPU pads to whole
    (8 * packing, 128) tiles (up to 5x the bytes for 3 KV heads of head_dim 64). Packed uint32
    [page_size * rows, 128]: no padding; a head's K / V is one sublane-strided uint32 load (stride =
    rows per token) split by shifts + bitcasts, the variant the TPU interpreter can run (it has no
    ref bitcasts). head_dim 64 packs [K | V] in one 128-lane vector: q is zero-padded to 128 lanes,
    so q.[K | V] = q.K, and P.[K | V] holds P.V in lanes 64..127.
  - The packed quantized layout (int8 / fp8 KV, kv_layout_quantized.py) is DMA'd by whole pages the same way and
    dequantized to float32 as it is loaded (tpu_quantized_kv.py); its keys come out page-minor, so the masks'
    token offsets follow that order (token_offsets).
  - Running max and sum are kept lane-replicated ([rows, 128]) to avoid unaligned 1-lane slices.
Pages past a sequence's length are not fetched; their stale VMEM is masked out of logits and V. With a sliding
window, a (tile, sequence)'s chunks start at the page holding its first row's window start, so pages before it are
never fetched either: the scheduler frees them, and their table entries may point at another request's pages.
Attention sinks (gpt-oss) join each row's sum after its last chunk (tpu_online_softmax.fold_sinks).
"""

import functools
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float, UInt32

from pallas_kernels.ragged_paged_attention.kv_layout import kernel_layout
from pallas_kernels.ragged_paged_attention.metadata import MASK_VALUE, AttentionMetadata
from pallas_kernels.ragged_paged_attention.tpu_decode import ragged_paged_attention_tpu_decode
from pallas_kernels.ragged_paged_attention.tpu_kv_reads import kv_scratch_shape, load_head
from pallas_kernels.ragged_paged_attention.tpu_kv_reads import page_rows as kv_page_rows
from pallas_kernels.ragged_paged_attention.tpu_online_softmax import accumulate_head, fold_sinks
from pallas_kernels.ragged_paged_attention.tpu_quantized_kv import token_offsets
from pallas_kernels.ragged_paged_attention.tpu_smem import DEFAULT_SMEM_BUDGET_BYTES, sequences_per_call
from pallas_kernels.ragged_paged_attention.tpu_step_cases import STEP_CASES, attend_by_case
from pallas_kernels.ragged_paged_attention.tpu_vmem import (
    decode_compute_pages,
    decode_intermediate_bytes,
    decode_pages_per_block,
    default_vmem_limit_bytes,
    prefill_blocks,
    vmem_bytes,
)
from pallas_kernels.ragged_paged_attention.vector_order import LANES

_LANES = 128


def _packing(dtype) -> int:
    return 4 // jnp.dtype(dtype).itemsize


def _kernel(kv_lens_ref, tables_ref, cu_q_lens_ref, tile_seqs_ref,  # scalar prefetch (SMEM)
            q_ref, kv_hbm_ref,  # inputs: q tile in VMEM, all pages in HBM
            *refs,  # [sinks (VMEM, with sinks)], the output tile, then the scratch
            sm_scale, sliding_window, soft_cap, pages_per_chunk, pages_per_seq, page_size, layout, has_sinks):
    sinks_ref, refs = (refs[0], refs[1:]) if has_sinks else (None, refs)
    out_ref, kv_buf, sems, max_ref, sum_ref, acc_ref = refs
    num_kv_heads, group_size, q_block_size, head_dim = q_ref.shape  # head_dim: 128 for packed head_dim 64
    chunk_tokens = pages_per_chunk * page_size
    page_rows = kv_page_rows(layout, page_size)
    num_rows = group_size * q_block_size
    max_num_seqs = kv_lens_ref.shape[0]
    tile = pl.program_id(0)
    tile_start = tile * q_block_size
    first_seq, end_seq = tile_seqs_ref[2 * tile], tile_seqs_ref[2 * tile + 1]

    def first_page(seq):
        """The page of the first token the tile's rows of `seq` see: its first row's window start (0 without a
        window). Chunks count from it, so no page before it is ever fetched."""
        if sliding_window is None:
            return 0
        seq = jnp.minimum(seq, max_num_seqs - 1)
        first_position = kv_lens_ref[seq] - cu_q_lens_ref[seq + 1] + jnp.maximum(cu_q_lens_ref[seq], tile_start)
        return jnp.maximum(first_position - sliding_window + 1, 0) // page_size

    def chunk_range(seq):
        """[0, end) KV chunks, from first_page, the tile's rows of `seq` attend to (at least one chunk)."""
        seq = jnp.minimum(seq, max_num_seqs - 1)
        q_end, kv_len = cu_q_lens_ref[seq + 1], kv_lens_ref[seq]
        last_position = kv_len - q_end + jnp.minimum(q_end, tile_start + q_block_size) - 1
        return jnp.int32(0), jnp.maximum((last_position + 1 - first_page(seq) * page_size + chunk_tokens - 1)
                                         // chunk_tokens, 1)

    def chunk_start(seq, chunk):
        """The first token of the chunk."""
        return (first_page(seq) + chunk * pages_per_chunk) * page_size

    def live_pages(seq, chunk):
        """Pages of the chunk below kv_len: only those are fetched."""
        return jnp.clip((kv_lens_ref[seq] - chunk_start(seq, chunk) + page_size - 1) // page_size, 0,
                        pages_per_chunk)

    def start_fetch(seq, chunk, slot):
        # A loop, not one unrolled copy per page: a 1k-token chunk is 64 pages of 16, and unrolled they made
        # libtpu's compile of this kernel ~5x slower.
        def start_page(i, _):
            page = jnp.minimum(first_page(seq) + chunk * pages_per_chunk + i, pages_per_seq - 1)
            pltpu.make_async_copy(kv_hbm_ref.at[tables_ref[seq * pages_per_seq + page]],
                                  kv_buf.at[slot, pl.ds(i * page_rows, page_rows)], sems.at[slot]).start()
            return ()
        jax.lax.fori_loop(0, live_pages(seq, chunk), start_page, ())

    def wait_fetch(seq, chunk, slot):
        # One wait for every page started: the descriptor's size is the bytes started (as in tpu_decode.py).
        live = live_pages(seq, chunk)

        @pl.when(live > 0)
        def _wait():
            started = kv_buf.at[slot, pl.ds(0, live * page_rows)]
            pltpu.make_async_copy(started, started, sems.at[slot]).wait()

    max_ref[...] = jnp.full(max_ref.shape, MASK_VALUE, jnp.float32)
    sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    # Row r of a [group_size * q_block_size, ...] operand is token r % q_block_size of the tile.
    # A chunk (one DMA, up to 1k tokens) is attended in compute slices of up to DECODE_COMPUTE_TOKENS (a fori_loop):
    # Mosaic unrolls vector ops over vregs, so [rows, 1k] intermediates made libtpu's compile several times slower.
    compute_tokens = decode_compute_pages(page_size, pages_per_chunk) * page_size
    row_tokens = tile_start + jax.lax.broadcasted_iota(
        jnp.int32, (group_size, q_block_size, compute_tokens), 1).reshape(num_rows, compute_tokens)
    # Token offsets of a slice's key rows (the packed quantized layout reads them page-minor: tpu_quantized_kv.py).
    column_offsets = token_offsets(layout, (num_rows, compute_tokens), 1, compute_tokens)
    value_offsets = token_offsets(layout, (compute_tokens, head_dim), 0, compute_tokens)
    # float32 caches ask the MXU for full float32 products (several bf16 passes), not one pass.
    precision = jax.lax.Precision.HIGHEST if q_ref.dtype == jnp.float32 else None

    def attend_chunk(seq, chunk, slot):
        q_start, q_end, kv_len = cu_q_lens_ref[seq], cu_q_lens_ref[seq + 1], kv_lens_ref[seq]
        positions = kv_len - q_end + row_tokens
        rows_are_real = (row_tokens >= q_start) & (row_tokens < q_end)
        start = chunk_start(seq, chunk)
        num_slices = jnp.clip((kv_len - start + compute_tokens - 1) // compute_tokens, 0,
                              chunk_tokens // compute_tokens)

        def attend_slice(index, carry):
            first = pl.multiple_of(index * compute_tokens, compute_tokens)
            kv_positions = start + first + column_offsets
            mask = rows_are_real & (kv_positions <= positions)
            if sliding_window is not None:
                mask &= kv_positions > positions - sliding_window
            value_is_real = start + first + value_offsets < kv_len
            for head in range(num_kv_heads):
                keys, values = load_head(kv_buf, slot, head, layout, compute_tokens, first, q_ref.dtype)
                accumulate_head(q_ref[head].reshape(num_rows, head_dim), keys, values, mask, value_is_real, head,
                                max_ref, sum_ref, acc_ref, sm_scale=sm_scale, soft_cap=soft_cap, precision=precision)
            return carry

        jax.lax.fori_loop(0, num_slices, attend_slice, ())

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
        if sinks_ref is not None:
            fold_sinks(sinks_ref, head, q_block_size, max_ref, sum_ref, acc_ref)
        row_sums = sum_ref[head][:, :1]
        out = acc_ref[head] / jnp.where(row_sums > 0, row_sums, 1.0)  # padding rows: 0, not 0/0
        out_ref[head] = out.reshape(group_size, q_block_size, head_dim).astype(out_ref.dtype)


def _interpret_params(interpret) -> Union[bool, pltpu.InterpretParams]:
    if isinstance(interpret, pltpu.InterpretParams):
        return interpret
    return pltpu.InterpretParams() if interpret else False


def _tile_sequence_ranges(cu_q_lens, num_seqs, num_tiles: int, q_block_size: int, first_seq=0) -> jax.Array:
    """[2 * num_tiles] int32: per q tile, the first and one-past-last sequence owning its rows, among sequences
    first_seq..num_seqs (traced; a mixed step leaves its leading decodes to the decode kernel). A tile with no row of
    those sequences gets an empty range: it fetches nothing."""
    max_num_seqs = cu_q_lens.shape[0] - 1
    num_real_seqs = jnp.clip(num_seqs[0], 0, max_num_seqs)
    first_seq = jnp.clip(first_seq, 0, num_real_seqs)
    first_row, num_real_tokens = cu_q_lens[first_seq], cu_q_lens[num_real_seqs]
    seq_ids = jnp.arange(max_num_seqs)
    # Sorted: -1 for the skipped leading sequences, then the real ends, then "never" for padding.
    seq_ends = jnp.where(seq_ids < num_real_seqs, cu_q_lens[1:], jnp.iinfo(jnp.int32).max)
    seq_ends = jnp.where(seq_ids < first_seq, -1, seq_ends)
    tile_starts = jnp.arange(num_tiles, dtype=jnp.int32) * q_block_size
    last_rows = jnp.minimum(tile_starts + q_block_size, num_real_tokens) - 1
    first = jnp.searchsorted(seq_ends, tile_starts, side="right").astype(jnp.int32)
    end = jnp.searchsorted(seq_ends, last_rows, side="right").astype(jnp.int32) + 1
    owns_rows = (tile_starts < num_real_tokens) & (last_rows >= first_row)
    end = jnp.where(owns_rows, jnp.minimum(end, num_real_seqs), first)
    return jnp.stack([first, end], axis=1).reshape(-1)


def _general(q, kv_pages, kv_lens, block_tables, cu_q_lens, num_seqs, first_seq=0, *, sm_scale, sliding_window,
             soft_cap, q_block_size, pages_per_chunk, page_size, layout, interpret, vmem_limit_bytes, sinks=None):
    """The tile kernel over any ragged mix (prefill chunks, decodes, both) of sequences first_seq..num_seqs; zeros on
    rows of no such sequence. sinks: [num_q_heads] logits in the softmax's denominator, or None."""
    num_tokens, num_q_heads, head_dim = q.shape
    pages_per_seq = block_tables.shape[1]
    num_kv_heads = kv_pages.shape[2] // 2 if layout is None else layout.num_kv_heads
    group_size = num_q_heads // num_kv_heads
    chunk_tokens = pages_per_chunk * page_size
    buf_shape, buf_dtype = kv_scratch_shape(layout, chunk_tokens, 2 * num_kv_heads, head_dim, kv_pages.dtype,
                                            page_size)
    num_tiles = -(-num_tokens // q_block_size)
    padded_tokens = num_tiles * q_block_size
    # [tokens, q heads, d] -> [kv heads, group, tokens, d]: tokens on sublanes, a KV head's q heads
    # stacked into one matmul operand.
    q_tiles = jnp.pad(q, ((0, padded_tokens - num_tokens), (0, 0), (0, 0))).reshape(
        padded_tokens, num_kv_heads, group_size, head_dim).transpose(1, 2, 0, 3)
    tile_seqs = _tile_sequence_ranges(cu_q_lens, num_seqs, num_tiles, q_block_size, first_seq)
    tile_spec = pl.BlockSpec((num_kv_heads, group_size, q_block_size, head_dim),
                             lambda tile, *_: (0, 0, tile, 0))
    kernel = functools.partial(
        _kernel, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
        pages_per_chunk=pages_per_chunk, pages_per_seq=pages_per_seq, page_size=page_size, layout=layout,
        has_sinks=sinks is not None)
    in_specs = [tile_spec, pl.BlockSpec(memory_space=pl.ANY)]
    inputs = [q_tiles, kv_pages]
    if sinks is not None:  # a few scalars: SMEM
        in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
        inputs.append(sinks.astype(jnp.float32))
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(num_tiles,),
            in_specs=in_specs,
            out_specs=tile_spec,
            scratch_shapes=[
                pltpu.VMEM(buf_shape, buf_dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((num_kv_heads, group_size * q_block_size, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, group_size * q_block_size, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, group_size * q_block_size, head_dim), jnp.float32),
            ]),
        out_shape=jax.ShapeDtypeStruct(q_tiles.shape, q.dtype),
        # Tiles share nothing (each fetches its own first chunk), so megacore may split them.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
        name="ragged_paged_attention_tpu",
    )(kv_lens, block_tables.reshape(-1), cu_q_lens, tile_seqs, *inputs)
    return out.transpose(2, 0, 1, 3).reshape(padded_tokens, num_q_heads, head_dim)[:num_tokens]


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "q_block_size", "pages_per_chunk", "pages_per_block", "case",
    "num_kv_heads", "kv_cache_dtype", "page_size", "interpret", "vmem_limit_bytes", "smem_budget_bytes"))
def ragged_paged_attention_tpu(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    kv_pages: Union[Float[Array, "num_pages page_size kv_heads_x2 head_dim"], UInt32[Array, "num_pages rows lanes"]],
    metadata: AttentionMetadata,
    *,
    sm_scale: float,
    sliding_window: Optional[int] = None,
    soft_cap: Optional[float] = None,
    sinks: Optional[Float[Array, " num_q_heads"]] = None,
    q_block_size: Optional[int] = None,
    pages_per_chunk: Optional[int] = None,
    pages_per_block: Optional[int] = None,
    case: Optional[str] = None,
    num_kv_heads: Optional[int] = None,
    kv_cache_dtype: str = "auto",
    page_size: Optional[int] = None,
    interpret: Union[bool, pltpu.InterpretParams] = False,
    vmem_limit_bytes: Optional[int] = None,
    smem_budget_bytes: int = DEFAULT_SMEM_BUDGET_BYTES,
) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """The spec's contract on TPU; interpret=True (or InterpretParams) simulates a TPU on CPU.

    case: None picks per step (tpu_step_cases.py): decode-only steps run the decode kernel (tpu_decode.py),
    prefill-only ones the tile kernel, mixed ones both (the leading decodes through the decode kernel); "decode" /
    "general" / "mixed" force one (the caller vouches for "decode"). pages_per_chunk sizes the tile kernel's KV
    chunks, pages_per_block the decode DMAs.
    kv_pages: the interleaved cache, or the packed uint32 one of kv_layout.py (then num_kv_heads is required), or
    with kv_cache_dtype "int8" / "fp8_e4m3" the packed quantized one of kv_layout_quantized.py (and page_size).
    vmem_limit_bytes: None asks for most of the chip's VMEM (tpu_vmem.py); the decode blocks, and the tile kernel's
    q_block_size / pages_per_chunk when None, are sized to fit it (~256 q rows x ~1024 KV tokens for the MXU).
    sinks: one logit per q head in the softmax's denominator only (spec.py).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    kv_lens, block_tables, cu_q_lens, num_seqs = (metadata.kv_lens, metadata.block_tables, metadata.cu_q_lens,
                                                   metadata.num_seqs.reshape(1))
    max_num_seqs, pages_per_seq = block_tables.shape
    layout, page_size, kv_heads_x2 = kernel_layout(kv_pages, head_dim, q.dtype, num_kv_heads, kv_cache_dtype,
                                                   page_size)
    if case not in STEP_CASES:
        raise ValueError(f"case: must be one of {STEP_CASES}, got {case!r}")
    if vmem_limit_bytes is None:
        vmem_limit_bytes = default_vmem_limit_bytes()
    if q_block_size is None or pages_per_chunk is None:
        auto_q_block, auto_pages = prefill_blocks(num_tokens, page_size, num_q_heads, kv_heads_x2 // 2, head_dim,
                                                  q.dtype, layout, vmem_limit_bytes)
        q_block_size = q_block_size or auto_q_block
        pages_per_chunk = pages_per_chunk or auto_pages
    if pages_per_block is None:
        pages_per_block = decode_pages_per_block(page_size, pages_per_seq, kv_heads_x2 // 2, head_dim, q.dtype,
                                                 layout, vmem_limit_bytes)
    sublanes = 8 * _packing(q.dtype)
    if q_block_size % sublanes:
        raise ValueError(f"q_block_size: must be a multiple of {sublanes} for {q.dtype}, "
                         f"got {q_block_size}")
    # A page's DMA must cover whole (sublane) tiles of the buffer: tokens (interleaved) or word rows (packed).
    page_rows, row_tile = ((page_size, 8 * _packing(q.dtype)) if layout is None
                           else (kv_page_rows(layout, page_size), 8))
    if page_rows % row_tile:
        raise ValueError(f"kv_pages: page_size must make a page whole {row_tile}-row tiles on TPU, got {page_size}")
    compute_tokens = decode_compute_pages(page_size, pages_per_block) * page_size
    needed = max(vmem_bytes(num_q_heads, kv_heads_x2, head_dim, q.dtype, q_block_size=q_block_size,
                            chunk_tokens=pages_per_chunk * page_size, layout=layout),
                 vmem_bytes(num_q_heads, kv_heads_x2, head_dim, q.dtype, q_block_size=1,
                            chunk_tokens=pages_per_block * page_size, layout=layout,
                            intermediate_bytes=decode_intermediate_bytes(kv_heads_x2 // 2, head_dim, compute_tokens)))
    if needed > vmem_limit_bytes:
        raise ValueError(f"q_block_size/pages_per_chunk/pages_per_block: need {needed} bytes of VMEM, over "
                         f"vmem_limit_bytes={vmem_limit_bytes}; use smaller blocks")
    options: dict[str, Any] = dict(sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
                                   page_size=page_size, layout=layout, interpret=_interpret_params(interpret),
                                   vmem_limit_bytes=vmem_limit_bytes)
    if layout is not None and layout.combined:
        # q.[K | V] must see only K: zero lanes 64..127 of q; P.[K | V] puts P.V in lanes 64..127.
        q = jnp.pad(q, ((0, 0), (0, 0), (0, LANES - head_dim)))
    if sinks is not None:
        options["sinks"] = sinks
    general = functools.partial(_general, q_block_size=q_block_size, pages_per_chunk=pages_per_chunk, **options)
    decode = functools.partial(ragged_paged_attention_tpu_decode, pages_per_block=pages_per_block, **options)

    def attend(kv_lens, block_tables, cu_q_lens, num_seqs):
        return attend_by_case(q, kv_pages, kv_lens, block_tables, cu_q_lens, num_seqs, decode=decode, general=general,
                              case=case)

    num_tiles = -(-num_tokens // q_block_size)
    per_call = sequences_per_call(max_num_seqs, pages_per_seq, num_tiles, smem_budget_bytes)
    num_real_seqs = jnp.clip(num_seqs[0], 0, max_num_seqs)
    rows = jnp.arange(num_tokens)
    out = jnp.zeros(q.shape, q.dtype)
    # Usually one call; more only when the block table would overflow SMEM. Each call's rows are the
    # token range of its real sequences; every other row keeps what earlier calls wrote (or zeros).
    for first in range(0, max_num_seqs, per_call):
        end = min(first + per_call, max_num_seqs)
        call_seqs = jnp.clip(num_real_seqs - first, 0, end - first)
        part = attend(kv_lens[first:end], block_tables[first:end], cu_q_lens[first:end + 1],
                      call_seqs.reshape(1).astype(num_seqs.dtype))
        owned = (rows >= cu_q_lens[first]) & (rows < cu_q_lens[first + call_seqs])
        out = jnp.where(owned[:, None, None], part, out)
    return out[..., LANES - head_dim:] if layout is not None and layout.combined else out
