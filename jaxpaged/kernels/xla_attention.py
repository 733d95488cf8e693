"""The "xla" backend: ragged paged attention in jnp, the engine's CPU path (spec.py says what it computes).

This is the production CPU path, so its cost grows with the KV actually attended, never with the
block table's width.
  - On the CPU, every q row goes through the native kernel (jaxpaged/kernels/cpu_native): each row reads its
    sequence's pages in place, up to its causal end, a prefill chunk's rows a block at a time.
  - Elsewhere (or without a compiler), loops with *traced* trip counts walk KV chunks of a few pages, in two
    passes. Decode pass: every sequence with one new token at once, each row gathering its own pages. Prefill
    pass: blocks of q rows of one sequence, each block gathering its chunks once and walking only the chunks its
    causal (and sliding) window reaches.
Online softmax in float32 throughout; GQA reads each KV head once for its whole group of q heads. Attention sinks
(gpt-oss: one learned logit per q head in the softmax's denominator only) start each row's running max at its sink and
its running sum at 1, as if a key of value zero sat before the first token.
Sliding-window layers read only the pages inside each row's window: a row's (or q block's) chunks start at the page
holding its window's first token, never before it (the pages before it may already be freed, back to the pool, and
their table entries point at another request's data), so the work is bounded by (window + q rows) / page_size pages,
whatever the context length.
The pages may be floats, bfloat16 bits ("interleaved_bits", kv_layout.py: XLA:CPU's bfloat16 scatter is not in
place) or quantized rows ("quantized": int8 / fp8 codes with a scale per row, kv_quantization.py); every gather goes
through _split_kv (bits and codes to float32 right after the gather) and every write through kv_storage.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxpaged.kernels.cpu_native.paged_decode import KV_DTYPES, native_decode_available, paged_decode
from pallas_kernels.bfloat16_bits import from_bits
from pallas_kernels.kv_quantization import dequantize_rows, is_quantized_pool
from pallas_kernels.ragged_paged_attention.kv_layout import KVPages, kv_storage
from pallas_kernels.ragged_paged_attention.metadata import MASK_VALUE, AttentionMetadata

# Pages gathered per loop step. 4 pages of 16 tokens = 64 KV tokens: big enough that the loop
# overhead is small, small enough that decode rows waste little past their kv_len.
DEFAULT_PAGES_PER_CHUNK = 4
# Prefill rows handled together: one KV gather serves them all; rows past a sequence's end are waste.
DEFAULT_Q_BLOCK_SIZE = 32


def _online_softmax_update(carry, logits, mask, v, pv_spec: str, soft_cap: Optional[float]):
    """One flash-attention step: fold a chunk's masked logits and values into (max, sum, acc)."""
    running_max, running_sum, acc = carry
    if soft_cap is not None:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    logits = jnp.where(mask, logits, MASK_VALUE)
    new_max = jnp.maximum(running_max, logits.max(axis=-1))
    probs = jnp.where(mask, jnp.exp(logits - new_max[..., None]), 0.0)
    rescale = jnp.exp(running_max - new_max)
    running_sum = running_sum * rescale + probs.sum(axis=-1)
    acc = acc * rescale[..., None] + jnp.einsum(pv_spec, probs, v)
    return new_max, running_sum, acc


def _init_carry(stats_shape: tuple, head_dim: int, sinks: Optional[jax.Array] = None):
    """(max, sum, acc) before any KV: nothing seen, or with sinks ([num_kv_heads, group] logits) each row's sink
    alone (max = sink, sum = exp(0) = 1, acc = 0): the sink joins the denominator and adds nothing to the output."""
    if sinks is None:
        return (jnp.full(stats_shape, MASK_VALUE, jnp.float32), jnp.zeros(stats_shape, jnp.float32),
                jnp.zeros(stats_shape + (head_dim,), jnp.float32))
    return (jnp.broadcast_to(sinks, stats_shape).astype(jnp.float32), jnp.ones(stats_shape, jnp.float32),
            jnp.zeros(stats_shape + (head_dim,), jnp.float32))


def _finish(carry) -> jax.Array:
    """acc / sum; rows that saw no KV (padding) have sum 0 and give zeros, not 0/0."""
    _, running_sum, acc = carry
    return acc / jnp.where(running_sum > 0, running_sum, 1.0)[..., None]


def _window_mask(kv_positions, positions, sliding_window: Optional[int]) -> jax.Array:
    """[rows, chunk_tokens] causal (and sliding-window) mask; rows at position -1 see nothing. kv_positions:
    [chunk_tokens] shared by the rows, or [rows, chunk_tokens] each row's own."""
    if kv_positions.ndim == 1:
        kv_positions = kv_positions[None, :]
    mask = kv_positions <= positions[:, None]
    if sliding_window is not None:
        mask &= kv_positions > positions[:, None] - sliding_window
    return mask


def _window_first_page(position, page_size: int, sliding_window: int):
    """The page holding the first token a row at `position` sees through its window (0 for rows at position -1)."""
    return jnp.maximum(position - sliding_window + 1, 0) // page_size


def _end_chunk(last_position, chunk_tokens: int):
    """One past the KV chunk holding last_position: the chunks a causal row (without a window) walks from 0."""
    return jnp.maximum(last_position + chunk_tokens, 0) // chunk_tokens  # ceil((last + 1)/c)


def _split_kv(kv: jax.Array, num_kv_heads: int) -> tuple[jax.Array, jax.Array]:
    """[..., 2 * num_kv_heads, row] interleaved -> K, V each [..., num_kv_heads, head_dim] in float32 (quantized rows
    dequantized: the gathered chunk is the only KV ever held in float32)."""
    kv = dequantize_rows(kv) if is_quantized_pool(kv.dtype) else from_bits(kv).astype(jnp.float32)
    kv = kv.reshape(kv.shape[:-2] + (num_kv_heads, 2, kv.shape[-1]))
    return kv[..., 0, :], kv[..., 1, :]


def _decode_pass(q_grouped, kv_pages, kv_lens, block_tables, cu_q_lens, num_real_seqs, *,
                 pages_per_chunk, sliding_window, soft_cap, sinks):
    """Sequences with one new token, all at once: one row per sequence, each walking KV chunks of its own pages.
    Returns the rows' outputs and the q row each belongs to (num_tokens for inactive sequences)."""
    num_tokens = q_grouped.shape[0]
    max_num_seqs = kv_lens.shape[0]
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    is_decode = (jnp.arange(max_num_seqs) < num_real_seqs) & (q_lens == 1)
    rows = jnp.where(is_decode, cu_q_lens[1:] - 1, num_tokens)
    positions = jnp.where(is_decode, kv_lens - 1, -1)
    q_rows = q_grouped[jnp.minimum(rows, num_tokens - 1)]
    chunks = _decode_chunks if sliding_window is None else _decode_window_chunks
    out = chunks(q_rows, kv_pages, positions, block_tables, pages_per_chunk=pages_per_chunk,
                 sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks)
    return out, rows


def _native_fits(kv_pages, group_size: int) -> bool:
    """Whether the native CPU kernel is built and takes this pool's dtype and shapes (its compiled limits)."""
    page_size = kv_pages.shape[1]
    num_kv_heads = kv_pages.shape[2] // 2
    return (kv_pages.dtype in KV_DTYPES and group_size <= 16 and group_size * num_kv_heads <= 256 and page_size <= 256
            and native_decode_available())


def _decode_chunks(q_rows, kv_pages, positions, block_tables, *, pages_per_chunk, sliding_window, soft_cap, sinks):
    """The jnp decode without a window: every row walks the same KV chunks (the longest row's), gathering its own
    pages."""
    assert sliding_window is None, "sliding layers decode through _decode_window_chunks"
    max_num_seqs, num_kv_heads, group_size, head_dim = q_rows.shape
    chunk_tokens = pages_per_chunk * kv_pages.shape[1]
    end_chunk = _end_chunk(jnp.max(positions), chunk_tokens)

    def attend_chunk(chunk, carry):
        page_ids = jax.lax.dynamic_slice_in_dim(block_tables, chunk * pages_per_chunk,
                                                pages_per_chunk, axis=1)
        k, v = _split_kv(kv_pages[page_ids].reshape(max_num_seqs, chunk_tokens, -1, kv_pages.shape[-1]),
                         num_kv_heads)
        logits = jnp.einsum("skgd,sckd->skgc", q_rows, k)
        kv_positions = chunk * chunk_tokens + jnp.arange(chunk_tokens, dtype=jnp.int32)
        mask = _window_mask(kv_positions, positions, sliding_window)[:, None, None, :]
        return _online_softmax_update(carry, logits, mask, v, "skgc,sckd->skgd", soft_cap)

    carry = _init_carry((max_num_seqs, num_kv_heads, group_size), head_dim, sinks)
    return _finish(jax.lax.fori_loop(0, end_chunk, attend_chunk, carry))


def _decode_window_chunks(q_rows, kv_pages, positions, block_tables, *, pages_per_chunk, sliding_window, soft_cap,
                          sinks):
    """The jnp decode of a sliding-window layer: each row's chunks start at its own window's first page, so a row
    reads about window / page_size pages however long its sequence, and never a page before its window."""
    max_num_seqs, num_kv_heads, group_size, head_dim = q_rows.shape
    page_size = kv_pages.shape[1]
    chunk_tokens = pages_per_chunk * page_size
    first_pages = _window_first_page(positions, page_size, sliding_window)
    # The longest walk of any row: its window's pages up to its own, in whole chunks (rows at -1 walk none).
    num_chunks = jnp.max(jnp.where(positions >= 0, positions // page_size + 1 - first_pages, 0))
    num_chunks = (num_chunks + pages_per_chunk - 1) // pages_per_chunk
    in_chunk = jnp.arange(pages_per_chunk, dtype=jnp.int32)

    def attend_chunk(chunk, carry):
        # The table is padded by a chunk (in_jnp), so no index runs past it.
        page_columns = first_pages[:, None] + chunk * pages_per_chunk + in_chunk[None, :]
        page_ids = jnp.take_along_axis(block_tables, page_columns, axis=1)
        k, v = _split_kv(kv_pages[page_ids].reshape(max_num_seqs, chunk_tokens, -1, kv_pages.shape[-1]),
                         num_kv_heads)
        logits = jnp.einsum("skgd,sckd->skgc", q_rows, k)
        kv_positions = (first_pages[:, None] + chunk * pages_per_chunk) * page_size + jnp.arange(
            chunk_tokens, dtype=jnp.int32)[None, :]
        mask = _window_mask(kv_positions, positions, sliding_window)[:, None, None, :]
        return _online_softmax_update(carry, logits, mask, v, "skgc,sckd->skgd", soft_cap)

    carry = _init_carry((max_num_seqs, num_kv_heads, group_size), head_dim, sinks)
    return _finish(jax.lax.fori_loop(0, num_chunks, attend_chunk, carry))


def _prefill_pass(out, q_grouped, kv_pages, kv_lens, block_tables, cu_q_lens, num_real_seqs, *,
                  pages_per_chunk, q_block_size, sliding_window, soft_cap, sinks):
    """Sequences with 2+ new tokens, one block of q_block_size rows at a time.

    All rows of a block share one sequence, so each KV chunk is gathered once per block, and a
    block only walks the chunks its own causal window needs: with a sliding window, chunks of pages from the page of
    its first row's window start (never a page before it).
    """
    num_tokens, num_kv_heads, group_size, head_dim = q_grouped.shape
    max_num_seqs = kv_lens.shape[0]
    page_size = kv_pages.shape[1]
    chunk_tokens = pages_per_chunk * page_size
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    is_prefill = (jnp.arange(max_num_seqs) < num_real_seqs) & (q_lens > 1)
    blocks_per_seq = jnp.where(is_prefill, -(-q_lens // q_block_size), 0)
    cu_blocks = jnp.cumsum(blocks_per_seq)
    # Pad rows so a block that starts near the end is never clamped backwards by dynamic_slice.
    q_padded = jnp.pad(q_grouped, ((0, q_block_size), (0, 0), (0, 0), (0, 0)))
    out_padded = jnp.pad(out, ((0, q_block_size), (0, 0), (0, 0), (0, 0)))

    def attend_block(block, out_padded):
        seq = jnp.searchsorted(cu_blocks, block, side="right")
        row_start = cu_q_lens[seq] + (block - (cu_blocks[seq] - blocks_per_seq[seq])) * q_block_size
        rows = row_start + jnp.arange(q_block_size, dtype=jnp.int32)
        in_block = rows < cu_q_lens[seq + 1]
        positions = jnp.where(in_block, kv_lens[seq] - q_lens[seq] + rows - cu_q_lens[seq], -1)
        q_block = jax.lax.dynamic_slice_in_dim(q_padded, row_start, q_block_size)
        table = block_tables[seq]

        if sliding_window is None:
            first_page, first_chunk, end_chunk = jnp.int32(0), jnp.int32(0), _end_chunk(jnp.max(positions),
                                                                                        chunk_tokens)
        else:  # chunks counted from the window's first page (the table is padded by a chunk: in_jnp)
            first_page = _window_first_page(positions[0], page_size, sliding_window)
            end_page = jnp.max(positions) // page_size + 1
            first_chunk, end_chunk = jnp.int32(0), jnp.maximum(end_page - first_page + pages_per_chunk - 1,
                                                               0) // pages_per_chunk

        def attend_chunk(chunk, carry):
            page_start = first_page + chunk * pages_per_chunk
            page_ids = jax.lax.dynamic_slice_in_dim(table, page_start, pages_per_chunk)
            k, v = _split_kv(kv_pages[page_ids].reshape(chunk_tokens, -1, kv_pages.shape[-1]), num_kv_heads)
            logits = jnp.einsum("rkgd,ckd->rkgc", q_block, k)
            kv_positions = page_start * page_size + jnp.arange(chunk_tokens, dtype=jnp.int32)
            mask = _window_mask(kv_positions, positions, sliding_window)[:, None, None, :]
            return _online_softmax_update(carry, logits, mask, v, "rkgc,ckd->rkgd", soft_cap)

        carry = _init_carry((q_block_size, num_kv_heads, group_size), head_dim, sinks)
        block_out = _finish(jax.lax.fori_loop(first_chunk, end_chunk, attend_chunk, carry))
        # Rows past the sequence's end belong to the next sequence: keep what is there.
        old = jax.lax.dynamic_slice_in_dim(out_padded, row_start, q_block_size)
        new = jnp.where(in_block[:, None, None, None], block_out, old)
        return jax.lax.dynamic_update_slice_in_dim(out_padded, new, row_start, axis=0)

    out_padded = jax.lax.fori_loop(0, cu_blocks[-1], attend_block, out_padded)
    return out_padded[:num_tokens]


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap",
                                             "pages_per_chunk", "q_block_size", "native"))
def ragged_paged_attention_xla(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    kv_pages: KVPages,
    metadata: AttentionMetadata,
    *,
    sm_scale: float,
    sliding_window: Optional[int] = None,
    soft_cap: Optional[float] = None,
    sinks: Optional[Float[Array, " num_q_heads"]] = None,
    pages_per_chunk: int = DEFAULT_PAGES_PER_CHUNK,
    q_block_size: int = DEFAULT_Q_BLOCK_SIZE,
    native: bool = True,
) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """Attention of every q row over its sequence's paged KV; padding rows come out as zeros (with sinks too).
    sinks: one logit per q head in the softmax's denominator (spec.py). native=False keeps every row on the jnp path
    even where the native CPU kernel runs (comparisons, benchmarks)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = kv_pages.shape[2] // 2
    kv_lens, block_tables, cu_q_lens = metadata.kv_lens, metadata.block_tables, metadata.cu_q_lens
    max_num_seqs, pages_per_seq = block_tables.shape
    pages_per_chunk = max(1, min(pages_per_chunk, pages_per_seq))
    q_block_size = max(1, min(q_block_size, num_tokens))
    num_real_seqs = jnp.clip(metadata.num_seqs.reshape(-1)[0], 0, max_num_seqs)
    # GQA without repeating K/V: q head j reads kv head j // group_size.
    q_grouped = (q.astype(jnp.float32) * sm_scale).reshape(
        num_tokens, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    sinks_grouped = None if sinks is None else sinks.astype(jnp.float32).reshape(num_kv_heads, -1)

    def in_jnp(q_grouped, kv_pages, kv_lens, block_tables, cu_q_lens, num_real_seqs):
        # Pad the table to whole chunks (null page 0) so a dynamic slice never gets clamped backwards; a sliding
        # window's chunks start at any page, so one chunk more.
        padded_width = -(-pages_per_seq // pages_per_chunk) * pages_per_chunk
        if sliding_window is not None:
            padded_width += pages_per_chunk
        block_tables = jnp.pad(block_tables, ((0, 0), (0, padded_width - pages_per_seq)))
        options = dict(pages_per_chunk=pages_per_chunk, sliding_window=sliding_window, soft_cap=soft_cap,
                       sinks=sinks_grouped)
        decode_out, decode_rows = _decode_pass(q_grouped, kv_pages, kv_lens, block_tables, cu_q_lens,
                                               num_real_seqs, **options)
        out = jnp.zeros_like(q_grouped).at[decode_rows].set(decode_out, mode="drop")
        return _prefill_pass(out, q_grouped, kv_pages, kv_lens, block_tables, cu_q_lens, num_real_seqs,
                             q_block_size=q_block_size, **options)

    args = (q_grouped, kv_pages, kv_lens, block_tables, cu_q_lens, num_real_seqs)
    if native and _native_fits(kv_pages, q_grouped.shape[2]):
        every_row = functools.partial(_native_every_row, sliding_window=sliding_window, soft_cap=soft_cap,
                                      sinks=sinks)
        out = jax.lax.platform_dependent(*args, cpu=every_row, default=in_jnp)
    else:
        out = in_jnp(*args)
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)


def _native_every_row(q_grouped, kv_pages, kv_lens, block_tables, cu_q_lens, num_real_seqs, *,
                      sliding_window, soft_cap, sinks):
    """Every q row at once through the native kernel (CPU), each at its own position in its sequence.

    Each row reads its sequence's pages 0..position in place, a prefill chunk's consecutive rows a block at a time
    (each K/V row read once for the block), and no KV chunk is gathered or masked past the causal end (the jnp
    prefill pass does both). Row r's sequence is found from cu_q_lens; the kernel reads its block-table row."""
    num_tokens = q_grouped.shape[0]
    max_num_seqs = kv_lens.shape[0]
    rows = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(cu_q_lens[1:], rows, side="right").astype(jnp.int32)
    real = seq < num_real_seqs
    seq = jnp.minimum(seq, max_num_seqs - 1)
    q_lens = cu_q_lens[seq + 1] - cu_q_lens[seq]
    positions = jnp.where(real, kv_lens[seq] - q_lens + rows - cu_q_lens[seq], -1)
    return paged_decode(q_grouped, kv_pages, positions, seq, block_tables, sliding_window=sliding_window,
                        soft_cap=soft_cap, sinks=sinks)


@jax.jit
def write_kv_pages(
    kv_pages: KVPages,
    k: Float[Array, "num_tokens num_kv_heads head_dim"],
    v: Float[Array, "num_tokens num_kv_heads head_dim"],
    slot_mapping: Int[Array, " num_tokens"],
) -> KVPages:
    """Scatter each token's K/V into slot page_id * page_size + offset (K at head 2h, V at 2h+1), as the pool
    stores them (floats, bfloat16 bits, or quantized rows: each quantized on its own, so a token's row never depends
    on its neighbours)."""
    num_pages, page_size, kv_heads_x2, _ = kv_pages.shape
    num_tokens, _, head_dim = k.shape
    interleaved = jnp.stack([k, v], axis=2).reshape(num_tokens, kv_heads_x2, head_dim)
    slots = kv_pages.reshape(num_pages * page_size, kv_heads_x2, kv_pages.shape[-1])
    slots = slots.at[slot_mapping].set(kv_storage(interleaved, kv_pages.dtype))
    return slots.reshape(kv_pages.shape)
