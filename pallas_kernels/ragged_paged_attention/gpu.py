"""Ragged paged attention through Pallas' Triton lowering: prefill chunks and decodes in one launch.

Grid: (q block, KV head, KV split). A q block is up to `block_rows // group_size` consecutive tokens
of ONE sequence times the group_size q heads sharing a KV head, i.e. `block_rows` rows of one
tensor-core (tl.dot) operand; so each K/V tile is loaded once per block for the whole GQA group. A decode is
a block of one token; a prefill chunk is as many blocks as it needs. The block list is built in the
wrapper from cu_q_lens (traced), padded to a static upper bound; blocks past the real count exit.

Each program walks only the KV chunks its own causal (and sliding) window reaches; with
num_kv_splits > 1 that range is cut into splits whose partial results (normalised output + log-sum-
exp) are merged afterwards — the decode case, where blocks alone cannot fill the GPU's SMs.

On the GPU memory is linear, so K/V pages are read as a flat [slots, 2 * num_kv_heads * head_dim]
matrix: K of head h is columns [2h * d, 2h * d + d), V the next d columns; a chunk's rows are
gathered by slot (page_id * page_size + offset). Triton needs power-of-two tile sides (>= 16 for
tl.dot): a head_dim that is not one (80, 96) is read as the next power of two with the extra
columns masked to zero, which changes no dot product; block sizes must be powers of two.

float32 inputs ask for Precision.HIGHEST, which Triton lowers to IEEE float32 dots; the default
would be TF32 (10-bit mantissa), far outside the float32 tolerance the spec tests hold.

Quantized pools (kv_cache_dtype int8 / fp8_e4m3, kv_quantization.py): a slot's row holds, per K or V head, head_dim
codes and the two bytes of their bfloat16 scale. A chunk's codes load as [chunk, head_dim] 8-bit tiles (a quarter of
float32's bytes), its scales as two byte columns joined into bfloat16 bits; the tile is dequantized to float32 in
registers right after the load (fp8 codes by integer arithmetic on their fields, which every GPU has) and the dots
run in float32, as the xla backend's do.

Attention sinks (gpt-oss: one logit per q head in the softmax's denominator only) join in the merge of the splits, as
one more split whose output is zero and whose log-sum-exp is the sink; a step with sinks always writes its splits'
log-sum-exps (one split or several).

Sliding windows: each program's chunks start at its block's window, and the slots of pages before the page holding
the window's first token are never loaded (masked loads): those pages may be freed and handed to another request.

KV splits: the grid's split axis is a static upper bound sized from the GPU's resident-program
capacity (SMs x programs an SM holds at once); each step then uses only as many splits as its
real blocks and each block's actual KV length need (split programs past that exit at once), so a
short decode does not pay for merging 16 nearly empty splits.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int

from pallas_kernels.kv_quantization import SCALE_BYTES, is_quantized_pool
from pallas_kernels.ragged_paged_attention.kv_layout import KVPages
from pallas_kernels.ragged_paged_attention.metadata import MASK_VALUE, AttentionMetadata

PREFILL_BLOCK_ROWS = 64
DEFAULT_KV_CHUNK_TOKENS = 64
MAX_KV_SPLITS = 16
MAX_HEAD_DIM = 256
# A split shorter than this many KV chunks costs more in its merge than it saves in parallelism.
DEFAULT_MIN_CHUNKS_PER_SPLIT = 4
_DEFAULT_SM_COUNT = 132  # H100 / H200, when the device does not say (CPU tracing, interpret mode)
_MAX_WARPS_PER_SM = 64
_MAX_PROGRAMS_PER_SM = 32
_SHARED_MEMORY_PER_SM = 228 * 1024


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _fp8_values(codes: jax.Array) -> jax.Array:
    """float8_e4m3fn bits (any integer dtype) as float32, from their fields: a normal code's exponent (bias 7) and
    mantissa move into float32's (bias 127), a subnormal one (exponent 0) is mantissa * 2^-9. NaN codes are never
    written (kv_quantization.py clips)."""
    bits = codes.astype(jnp.int32) & 0xFF
    magnitude = bits & 0x7F
    normal = jax.lax.bitcast_convert_type((magnitude << 20) + (120 << 23), jnp.float32)
    value = jnp.where(magnitude < 8, magnitude.astype(jnp.float32) * (1.0 / 512.0), normal)
    return jnp.where(bits >= 0x80, -value, value)


def _load_kv(kv_ref, slots, columns, scale_column, slot_is_real, dim_is_real, *, quantized: Optional[str]):
    """A chunk's K or V of one head, [chunk, padded_head_dim] at `columns` of each slot's row, as float32 values for
    a quantized pool ("int8" / "fp8_e4m3": codes times their row's scale, whose two bytes start at scale_column)."""
    rows = plgpu.load(kv_ref.at[slots[:, None], columns[None, :]], mask=slot_is_real[:, None] & dim_is_real[None, :],
                      other=0)
    if quantized is None:
        return rows
    low, high = (plgpu.load(kv_ref.at[slots, scale_column + i], mask=slot_is_real, other=0).astype(jnp.int32) & 0xFF
                 for i in range(SCALE_BYTES))
    scale = jax.lax.bitcast_convert_type(((high << 8) | low) << 16, jnp.float32)  # little-endian bfloat16 bits
    values = rows.astype(jnp.float32) if quantized == "int8" else _fp8_values(rows)
    return values * scale[:, None]


def _kernel(num_blocks_ref, block_seqs_ref, block_starts_ref, kv_lens_ref, cu_q_lens_ref,
            tables_ref, q_ref, kv_ref, out_ref, *lse_refs, sm_scale, sliding_window, soft_cap,
            group_size, num_q_heads, head_dim, padded_head_dim, page_size, pages_per_seq,
            chunk_tokens, block_rows, min_chunks_per_split, quantized):
    block, kv_head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    # num_blocks_ref = [real blocks, splits this step uses]; splits past it only write "empty".
    step_splits = num_blocks_ref[1]
    tokens_per_block = block_rows // group_size
    # Quantized K/V are dequantized to float32 tiles, and q joins them there.
    compute_dtype = jnp.float32 if quantized else q_ref.dtype
    precision = jax.lax.Precision.HIGHEST if compute_dtype == jnp.float32 else None
    row_width = head_dim + SCALE_BYTES if quantized else head_dim  # one head's K (or V) in a slot's row

    @pl.when(block < num_blocks_ref[0])
    def _attend_block():
        seq = block_seqs_ref[block]
        first_token = block_starts_ref[block]
        q_end, kv_len = cu_q_lens_ref[seq + 1], kv_lens_ref[seq]
        rows = jnp.arange(block_rows, dtype=jnp.int32)
        tokens = first_token + rows // group_size
        row_is_real = (rows < tokens_per_block * group_size) & (tokens < q_end)
        positions = kv_len - q_end + tokens
        q_rows = tokens * num_q_heads + kv_head * group_size + rows % group_size
        # Columns past head_dim (padding to a power of two) re-read column head_dim - 1 (never out
        # of bounds) and are masked to zero, so they add nothing to q.k and are never stored. Only a padded
        # head_dim clamps: unclamped columns are contiguous, so Triton vectorizes the loads (on an H200, decode
        # at (32, 8, 128) over 2k tokens went from 34 % to 57 % of copy bandwidth).
        padded_dims = jnp.arange(padded_head_dim, dtype=jnp.int32)
        dim_is_real = padded_dims < head_dim
        dims = padded_dims if padded_head_dim == head_dim else jnp.minimum(padded_dims, head_dim - 1)
        q = plgpu.load(q_ref.at[q_rows[:, None], dims[None, :]],
                       mask=row_is_real[:, None] & dim_is_real[None, :], other=0).astype(compute_dtype)

        # This block's KV chunks, then this split's share of them.
        last_position = kv_len - q_end + jnp.minimum(first_token + tokens_per_block, q_end) - 1
        end_chunk = (last_position + chunk_tokens) // chunk_tokens
        first_chunk = jnp.int32(0)
        if sliding_window is not None:
            first_position = kv_len - q_end + first_token
            first_chunk = jnp.maximum(first_position - sliding_window + 1, 0) // chunk_tokens
        # Splits from this block's own KV length: at least min_chunks_per_split chunks each.
        num_chunks = end_chunk - first_chunk
        num_splits = jnp.clip((num_chunks + min_chunks_per_split - 1) // min_chunks_per_split, 1,
                              step_splits)
        chunks_per_split = (num_chunks + num_splits - 1) // num_splits
        split_first = first_chunk + split * chunks_per_split
        split_end = jnp.where(split < num_splits,
                              jnp.minimum(split_first + chunks_per_split, end_chunk), split_first)
        offsets = jnp.arange(chunk_tokens, dtype=jnp.int32)
        # Pages before the one holding the block's window start are never loaded (they may belong to others now).
        first_loaded = jnp.int32(0)
        if sliding_window is not None:
            first_loaded = jnp.maximum(kv_len - q_end + first_token - sliding_window + 1, 0) // page_size * page_size
        k_columns = 2 * kv_head * row_width + dims
        k_scale_column = 2 * kv_head * row_width + head_dim

        def attend_chunk(chunk, carry):
            running_max, running_sum, acc = carry
            kv_positions = chunk * chunk_tokens + offsets
            page_columns = jnp.minimum(kv_positions // page_size, pages_per_seq - 1)
            page_ids = tables_ref[seq * pages_per_seq + page_columns]
            slots = page_ids * page_size + kv_positions % page_size
            slot_is_real = kv_positions < kv_len
            if sliding_window is not None:
                slot_is_real &= kv_positions >= first_loaded
            keys = _load_kv(kv_ref, slots, k_columns, k_scale_column, slot_is_real, dim_is_real, quantized=quantized)
            values = _load_kv(kv_ref, slots, row_width + k_columns, row_width + k_scale_column, slot_is_real,
                              dim_is_real, quantized=quantized)
            logits = jax.lax.dot_general(q, keys, (((1,), (1,)), ((), ())), precision=precision,
                                         preferred_element_type=jnp.float32) * sm_scale
            if soft_cap is not None:
                logits = soft_cap * jnp.tanh(logits / soft_cap)
            mask = row_is_real[:, None] & (kv_positions[None, :] <= positions[:, None])
            if sliding_window is not None:
                mask &= kv_positions[None, :] > positions[:, None] - sliding_window
            logits = jnp.where(mask, logits, MASK_VALUE)
            new_max = jnp.maximum(running_max, jnp.max(logits, axis=1))
            probs = jnp.where(mask, jnp.exp(logits - new_max[:, None]), 0.0)
            rescale = jnp.exp(running_max - new_max)
            running_sum = running_sum * rescale + jnp.sum(probs, axis=1)
            acc = acc * rescale[:, None] + jax.lax.dot_general(
                probs.astype(values.dtype), values, (((1,), (0,)), ((), ())), precision=precision,
                preferred_element_type=jnp.float32)
            return new_max, running_sum, acc

        init = (jnp.full((block_rows,), MASK_VALUE, jnp.float32),
                jnp.zeros((block_rows,), jnp.float32),
                jnp.zeros((block_rows, padded_head_dim), jnp.float32))
        running_max, running_sum, acc = jax.lax.fori_loop(split_first, split_end, attend_chunk,
                                                          init)
        seen_kv = running_sum > 0
        out = acc / jnp.where(seen_kv, running_sum, 1.0)[:, None]
        # Stores take the unclamped columns: clamped ones would repeat column head_dim - 1.
        plgpu.store(out_ref.at[split, q_rows[:, None], padded_dims[None, :]], out.astype(out_ref.dtype),
                    mask=row_is_real[:, None] & dim_is_real[None, :])
        if lse_refs:  # partial results of a KV split: merged by log-sum-exp in the wrapper
            lse = jnp.where(seen_kv, running_max + jnp.log(jnp.where(seen_kv, running_sum, 1.0)),
                            MASK_VALUE)
            plgpu.store(lse_refs[0].at[split, q_rows], lse, mask=row_is_real)


def _q_blocks(cu_q_lens, num_seqs, num_blocks_max: int, tokens_per_block: int):
    """Per q block (static count, real ones first): its sequence and first token; the real count."""
    max_num_seqs = cu_q_lens.shape[0] - 1
    num_real_seqs = jnp.clip(num_seqs[0], 0, max_num_seqs)
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    blocks_per_seq = jnp.where(jnp.arange(max_num_seqs) < num_real_seqs,
                               -(-q_lens // tokens_per_block), 0)
    cu_blocks = jnp.cumsum(blocks_per_seq)
    blocks = jnp.arange(num_blocks_max, dtype=jnp.int32)
    block_seqs = jnp.minimum(jnp.searchsorted(cu_blocks, blocks, side="right"),
                             max_num_seqs - 1).astype(jnp.int32)
    block_in_seq = blocks - (cu_blocks[block_seqs] - blocks_per_seq[block_seqs])
    block_starts = cu_q_lens[block_seqs] + block_in_seq * tokens_per_block
    return cu_blocks[-1:].astype(jnp.int32), block_seqs, block_starts.astype(jnp.int32)


def resident_programs(*, num_warps: int, num_stages: int, chunk_tokens: int, block_rows: int,
                      padded_head_dim: int, itemsize: int) -> int:
    """Programs the GPU keeps resident at once: SMs x min(warp, program and shared-memory limits).

    Shared memory per program is an estimate of what Triton allocates: num_stages buffered K and V
    chunks plus the q block. The SM count is the device's when it reports one (a GPU), else H100's.
    """
    device = jax.devices()[0]
    sm_count = getattr(device, "core_count", None) if device.platform == "gpu" else None
    shared = (2 * num_stages * chunk_tokens + block_rows) * padded_head_dim * itemsize
    per_sm = min(_MAX_PROGRAMS_PER_SM, _MAX_WARPS_PER_SM // num_warps, _SHARED_MEMORY_PER_SM // shared)
    return (sm_count or _DEFAULT_SM_COUNT) * max(1, per_sm)


def step_kv_splits(num_real_blocks: Int[Array, " 1"], *, capacity: int, num_kv_heads: int,
                   max_splits: int) -> Int[Array, " 1"]:
    """Splits this step uses: enough programs to fill `capacity`, given its real q blocks."""
    programs = jnp.maximum(num_real_blocks, 1) * num_kv_heads
    return jnp.clip(-(-capacity // programs), 1, max_splits).astype(jnp.int32)


def _merge_splits(out, lse, sinks=None):
    """Combine per-split normalised outputs by their log-sum-exp weights; sinks ([rows], one per output row) join as
    one more split of output zero and log-sum-exp sink (the denominator only)."""
    best = jnp.max(lse, axis=0)
    if sinks is not None:
        best = jnp.maximum(best, sinks)
    weights = jnp.exp(lse - best)
    total = jnp.sum(weights, axis=0)
    if sinks is not None:
        total = total + jnp.exp(sinks - best)
    return jnp.sum(out * weights[..., None], axis=0) / jnp.where(total > 0, total, 1.0)[..., None]


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "block_rows", "pages_per_chunk", "num_kv_splits",
    "min_chunks_per_split", "num_warps", "num_stages", "interpret"))
def ragged_paged_attention_gpu(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    kv_pages: KVPages,
    metadata: AttentionMetadata,
    *,
    sm_scale: float,
    sliding_window: Optional[int] = None,
    soft_cap: Optional[float] = None,
    sinks: Optional[Float[Array, " num_q_heads"]] = None,
    block_rows: Optional[int] = None,
    pages_per_chunk: Optional[int] = None,
    num_kv_splits: Optional[int] = None,
    min_chunks_per_split: int = DEFAULT_MIN_CHUNKS_PER_SPLIT,
    num_warps: int = 4,
    num_stages: int = 2,
    interpret: bool = False,
) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """The spec's contract on a GPU; interpret=True runs the kernel as plain jnp on the CPU. kv_pages: the interleaved
    pool of q's dtype, or a quantized one (int8 / uint8 rows of codes and a scale, kv_quantization.py). sinks: one
    logit per q head in the softmax's denominator (spec.py)."""
    num_tokens, num_q_heads, head_dim = q.shape
    kv_lens, block_tables, cu_q_lens, num_seqs = (metadata.kv_lens, metadata.block_tables, metadata.cu_q_lens,
                                                   metadata.num_seqs.reshape(1))
    num_pages, page_size, kv_heads_x2, row_width = kv_pages.shape
    quantized = None
    if is_quantized_pool(kv_pages.dtype):
        quantized = "int8" if kv_pages.dtype == jnp.int8 else "fp8_e4m3"
    max_num_seqs, pages_per_seq = block_tables.shape
    num_kv_heads = kv_heads_x2 // 2
    group_size = num_q_heads // num_kv_heads
    if block_rows is None:
        # A bucket with no more tokens than sequences is mostly decodes: one token's group of q
        # heads per block, so small blocks waste less; otherwise prefill rows want reuse of K/V.
        one_token = max(16, 1 << (group_size - 1).bit_length())
        block_rows = one_token if num_tokens <= max_num_seqs else max(PREFILL_BLOCK_ROWS, one_token)
    if pages_per_chunk is None:
        pages_per_chunk = max(1, DEFAULT_KV_CHUNK_TOKENS // page_size)
    chunk_tokens = pages_per_chunk * page_size
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim: at most {MAX_HEAD_DIM} on the GPU kernel (a q block and a K/V chunk "
                         f"must fit in registers), got {head_dim}")
    # Triton's tile sides are powers of two >= 16: other head_dims are read padded and masked.
    padded_head_dim = max(16, 1 << (head_dim - 1).bit_length())
    for name, value in (("block_rows", block_rows), ("pages_per_chunk * page_size", chunk_tokens)):
        if not _is_power_of_two(value) or value < 16:
            raise ValueError(f"{name}: must be a power of two >= 16 for Triton, got {value}")
    if block_rows < group_size:
        raise ValueError(f"block_rows: must hold one token's {group_size} q heads, got {block_rows}")

    tokens_per_block = block_rows // group_size
    num_blocks_max = num_tokens // tokens_per_block + min(max_num_seqs, num_tokens) + 1
    capacity = resident_programs(num_warps=num_warps, num_stages=num_stages, chunk_tokens=chunk_tokens,
                                 block_rows=block_rows, padded_head_dim=padded_head_dim,
                                 itemsize=jnp.dtype(q.dtype).itemsize)
    if num_kv_splits is None:
        # The static bound assumes the step fills at least half its token bucket (the runner's
        # buckets double); emptier steps get fewer splits than ideal, never wrong results.
        min_real_blocks = max(1, num_tokens // (2 * tokens_per_block))
        wanted = -(-capacity // (min_real_blocks * num_kv_heads))
        num_kv_splits = min(MAX_KV_SPLITS, 1 << max(0, wanted - 1).bit_length())
    num_blocks, block_seqs, block_starts = _q_blocks(cu_q_lens, num_seqs, num_blocks_max,
                                                     tokens_per_block)
    splits = step_kv_splits(num_blocks, capacity=capacity, num_kv_heads=num_kv_heads,
                            max_splits=num_kv_splits)
    split_outputs = num_kv_splits > 1 or sinks is not None  # sinks join at the merge
    out_shapes = [jax.ShapeDtypeStruct((num_kv_splits, num_tokens * num_q_heads, head_dim),
                                       jnp.float32 if split_outputs else q.dtype)]
    if split_outputs:
        out_shapes.append(jax.ShapeDtypeStruct((num_kv_splits, num_tokens * num_q_heads),
                                               jnp.float32))
    kernel = functools.partial(
        _kernel, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
        group_size=group_size, num_q_heads=num_q_heads, head_dim=head_dim,
        padded_head_dim=padded_head_dim, page_size=page_size,
        pages_per_seq=pages_per_seq, chunk_tokens=chunk_tokens, block_rows=block_rows,
        min_chunks_per_split=min_chunks_per_split, quantized=quantized)
    outputs = pl.pallas_call(
        kernel,
        grid=(num_blocks_max, num_kv_heads, num_kv_splits),
        out_shape=out_shapes,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="ragged_paged_attention_gpu",
    )(jnp.concatenate([num_blocks, splits]), block_seqs, block_starts, kv_lens, cu_q_lens, block_tables.reshape(-1),
      q.reshape(num_tokens * num_q_heads, head_dim),
      # Linear GPU memory: this reshape is free, and makes every slot one row of K/V columns.
      kv_pages.reshape(num_pages * page_size, kv_heads_x2 * row_width))
    row_sinks = None if sinks is None else jnp.tile(sinks.astype(jnp.float32), num_tokens)  # row t * heads + h
    out = _merge_splits(outputs[0], outputs[1], row_sinks) if split_outputs else outputs[0][0]
    # Rows outside every sequence were never written (uninitialised memory): zero them.
    num_real_tokens = cu_q_lens[jnp.clip(num_seqs[0], 0, max_num_seqs)]
    row_is_real = jnp.repeat(jnp.arange(num_tokens) < num_real_tokens, num_q_heads)
    out = jnp.where(row_is_real[:, None], out, 0).astype(q.dtype)
    return out.reshape(num_tokens, num_q_heads, head_dim)
