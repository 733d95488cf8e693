"""The jitted, batched sampler: logits of the sampling rows in, token ids (and asked-for logprobs) out.

Per row, in vLLM V1's order: logit_bias and suppressed ids, then repetition, frequency and presence
penalties; greedy rows take the argmax there. Sampling rows then divide by the temperature, apply min_p,
then top_k and top_p, and draw with the Gumbel-max trick. Returned logprobs (only when a row asks for them) are
log_softmax of the *raw* logits (before any of the above), like vLLM's default.

Each row's randomness is a hash of (seed, num_output_tokens, token id) and nothing else, so a seeded
request samples the same tokens whatever else is in the batch and whichever row it sits in.

The host side (SamplingRow, build_sampling_batch, the flags) lives in sampling_batch.py and is re-exported
here, so callers import everything from this module.
"""

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, UInt32

from jaxpaged.sampling.batch import (
    SAMPLING_MODES,
    SamplerFlags,
    SamplingBatch,
    SamplingRow,
    all_sampler_flag_variants,
    build_sampling_batch,
    min_tokens_suppress_ids,
    sampler_static_flags,
    split_seed,
    warmup_sampling_batch,
)
from jaxpaged.sampling.params import MAX_LOGPROBS
from pallas_kernels.pytree import HostOrDeviceArray, register_pytree_dataclass

__all__ = [
    "SAMPLING_MODES", "SamplerFlags", "SamplerOutput", "SamplingBatch", "SamplingRow",
    "all_sampler_flag_variants", "apply_logit_adjustments", "build_sampling_batch",
    "min_tokens_suppress_ids", "sample", "sampler_static_flags", "split_seed",
    "warmup_sampling_batch",
]


@register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """What one sampler call returns, per padded row (padded rows hold meaningless values).

    jax.Arrays as `sample` returns them; numpy arrays once the runner has fetched them (`jax.device_get`).
    """

    token_ids: Int[HostOrDeviceArray, " num_rows"]
    """The sampled token id (int32)."""
    logprobs: Optional[Float[HostOrDeviceArray, " num_rows"]] = None
    """log_softmax of the raw logits at the sampled id; None unless a row asked for logprobs (as the next three)."""
    top_logprob_ids: Optional[Int[HostOrDeviceArray, "num_rows num_top_logprobs"]] = None
    """Ids of the min(20, vocab) most likely tokens under the raw logits, best first."""
    top_logprobs: Optional[Float[HostOrDeviceArray, "num_rows num_top_logprobs"]] = None
    """Their raw logprobs, best first."""
    sampled_ranks: Optional[Int[HostOrDeviceArray, " num_rows"]] = None
    """1-based rank of the sampled id under the raw logprobs (vLLM's: how many tokens are at least as likely)."""


def apply_logit_adjustments(logits: Float[HostOrDeviceArray, "num_rows vocab_size"],
                            batch: SamplingBatch) -> Float[Array, "num_rows vocab_size"]:
    """logit_bias (with -inf on suppressed ids), then repetition, frequency and presence penalties."""
    if batch.output_token_counts is None or batch.prompt_token_mask is None or batch.logit_bias is None:
        raise ValueError("batch: the penalties variant needs output_token_counts, prompt_token_mask and "
                         "logit_bias, got None (build the batch with build_sampling_batch)")
    logits = logits + batch.logit_bias
    counts = batch.output_token_counts.astype(jnp.float32)
    in_output = batch.output_token_counts > 0
    repetition = batch.repetition_penalties[:, None]
    # HF/vLLM repetition penalty: shrink the logit towards zero from either side, on prompt and output.
    penalized = jnp.where(logits > 0, logits / repetition, logits * repetition)
    logits = jnp.where(batch.prompt_token_mask | in_output, penalized, logits)
    logits = logits - batch.frequency_penalties[:, None] * counts
    return logits - batch.presence_penalties[:, None] * in_output.astype(jnp.float32)


def _apply_min_p(scaled_logits: Float[Array, "num_rows vocab_size"],
                 min_ps: Float[HostOrDeviceArray, " num_rows"]) -> Float[Array, "num_rows vocab_size"]:
    # p_i >= min_p * p_max  <=>  l_i - l_max >= log(min_p): no softmax needed, and log(0) = -inf keeps all.
    max_logits = jnp.max(scaled_logits, axis=-1, keepdims=True)
    keep = scaled_logits - max_logits >= jnp.log(min_ps)[:, None]
    return jnp.where(keep, scaled_logits, -jnp.inf)


def _order_keys(logits: Float[HostOrDeviceArray, "num_rows vocab_size"]) -> Int[Array, "num_rows vocab_size"]:
    """int32 keys that order exactly like the float32 logits (-inf lowest), for an exact integer bisection."""
    bits = jax.lax.bitcast_convert_type(logits, jnp.int32)
    # Negative floats order backwards as signed ints: flipping their magnitude bits fixes it.
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFF_FFFF), bits)


def _largest_key_where(keys: Int[Array, "num_rows vocab_size"], holds) -> Int[Array, " num_rows"]:
    """Per row, the largest int32 t for which holds(keys >= t) is true, given it holds at t = INT32_MIN
    and only gets harder as t grows; 32 halvings of the int32 range make it exact."""
    num_rows = keys.shape[0]
    low = jnp.full((num_rows,), jnp.iinfo(jnp.int32).min, jnp.int32)   # holds
    high = jnp.full((num_rows,), jnp.iinfo(jnp.int32).max, jnp.int32)  # a NaN's key: never holds

    def halve(_, bounds):
        low, high = bounds
        middle = (low >> 1) + (high >> 1) + (low & high & 1)  # floor((low + high) / 2) without overflow
        ok = holds(keys >= middle[:, None])
        return jnp.where(ok, middle, low), jnp.where(ok, high, middle)

    low, _ = jax.lax.fori_loop(0, 32, halve, (low, high))
    return low


def _apply_top_k_top_p(scaled_logits: Float[HostOrDeviceArray, "num_rows vocab_size"],
                       top_ks: Int[HostOrDeviceArray, " num_rows"],
                       top_ps: Float[HostOrDeviceArray, " num_rows"]) -> Float[Array, "num_rows vocab_size"]:
    """Keeps the top_k best tokens, then the smallest head of them whose probability mass reaches top_p.

    Both filters keep everything at or above a per-row threshold, found by bisection on the logits' bit
    patterns instead of a sort over the vocabulary: O(32 * vocab) of cheap counts and sums, and a sort of
    [rows, vocab] is the slowest op of the sampler on CPU and TPU alike. Ties at a threshold are all kept.
    """
    keys = _order_keys(scaled_logits)
    top_k_threshold = _largest_key_where(keys, lambda kept: jnp.sum(kept, axis=-1) >= top_ks)
    top_k_threshold = jnp.where(top_ks > 0, top_k_threshold, jnp.iinfo(jnp.int32).min)
    in_top_k = keys >= top_k_threshold[:, None]
    probs = jax.nn.softmax(jnp.where(in_top_k, scaled_logits, -jnp.inf), axis=-1)
    top_p_threshold = _largest_key_where(
        keys, lambda kept: jnp.sum(jnp.where(kept, probs, 0.0), axis=-1) >= top_ps)
    # NOTE: top_p == 1 must keep everything, though an f32 sum of all probs may fall just short of 1.0.
    top_p_threshold = jnp.where(top_ps < 1.0, top_p_threshold, jnp.iinfo(jnp.int32).min)
    keep = in_top_k & (keys >= top_p_threshold[:, None])
    return jnp.where(keep, scaled_logits, -jnp.inf)


_UINT32_GOLDEN = 0x9E37_79B9
"""2**32 / golden ratio: an odd step that spreads consecutive counters over the uint32 range."""


def _mix32(x: UInt32[Array, "..."]) -> UInt32[Array, "..."]:
    """MurmurHash3's 32-bit finalizer: a bijection on uint32 where every input bit flips each output bit
    with probability ~1/2."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EB_CA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2_AE35)
    return x ^ (x >> 16)


def _gumbel_noise(seed_words: UInt32[HostOrDeviceArray, "num_rows 2"],
                  num_output_tokens: Int[HostOrDeviceArray, " num_rows"],
                  vocab_size: int) -> Float[Array, "num_rows vocab_size"]:
    """Gumbel(0, 1) noise per row and token from a counter-based hash of (seed, step, token id) alone.

    A hash instead of jax.random's threefry: threefry's unrolled rounds cost ~1 s of XLA compile on CPU per
    variant and bucket, and this integer-only hash gives the same bits on every backend.
    """
    golden = jnp.uint32(_UINT32_GOLDEN)
    steps = num_output_tokens.astype(jnp.uint32)
    # Chain every input word through the mixer, so nearby seeds or steps give unrelated streams.
    stream = _mix32(_mix32(_mix32(seed_words[:, 0] + golden) ^ seed_words[:, 1]) + steps * golden)
    offset = _mix32(stream ^ jnp.uint32(0x5BD1_E995))
    counters = jnp.arange(vocab_size, dtype=jnp.uint32)[None, :] * golden + stream[:, None]
    uniform = _uniform_from_bits(_mix32(_mix32(counters) ^ offset[:, None]))
    return -jnp.log(-jnp.log(uniform))


def _uniform_from_bits(bits: UInt32[HostOrDeviceArray, "..."]) -> Float[HostOrDeviceArray, "..."]:
    """The top 23 bits as a float32 strictly inside (0, 1), so -log(-log(u)) stays finite."""
    # NOTE: 23 bits, not 24: (2**24 - 0.5) / 2**24 rounds to exactly 1.0 in float32, which would make
    # one token's noise +inf (and NaN on a filtered token).
    return ((bits >> 9).astype(jnp.float32) + 0.5) * (1.0 / (1 << 23))


_ARGMAX_BLOCK = 128
"""Columns per block of `row_argmax` (most vocabularies are a multiple of it; others are padded)."""


def row_argmax(values: Float[Array, "num_rows n"]) -> Int[Array, " num_rows"]:
    """jnp.argmax(values, axis=-1), exactly (the first index of the maximum; a NaN counts as the maximum), in two
    levels: the maximum of each 128-column block, the first block holding the row's maximum, then the first index
    in that block. XLA:CPU runs a variadic (value, index) reduction as a scalar loop, over a full vocabulary a
    sizeable part of a decode step (docs/performance.md); a plain max reduction vectorises, and what is left
    for argmax is the block maxima (384 per row at a 49,152 vocabulary) and one 128-column block per row. The
    first block whose maximum equals the row's holds the row's first maximum, and a NaN makes its block's maximum
    NaN, so both keep argmax's answer."""
    num_rows, n = values.shape
    num_blocks = -(-n // _ARGMAX_BLOCK)
    if num_blocks * _ARGMAX_BLOCK != n:  # -inf never beats a real entry; an all -inf row still answers 0
        values = jnp.pad(values, ((0, 0), (0, num_blocks * _ARGMAX_BLOCK - n)), constant_values=-jnp.inf)
    blocks = values.reshape(num_rows, num_blocks, _ARGMAX_BLOCK)
    best_block = jnp.argmax(jnp.max(blocks, axis=-1), axis=-1)
    within = jnp.take_along_axis(blocks, best_block[:, None, None], axis=1)[:, 0]
    return (best_block * _ARGMAX_BLOCK + jnp.argmax(within, axis=-1)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("flags",))
def sample(logits: Float[Array, "num_rows vocab_size"], batch: SamplingBatch,
           flags: SamplerFlags) -> SamplerOutput:
    """Samples one token per row; compiled once per (row bucket, vocab_size, flags)."""
    num_rows, vocab_size = logits.shape
    if batch.temperatures.shape != (num_rows,):
        raise ValueError(f"batch: expected {num_rows} rows like logits, got {batch.temperatures.shape}")
    raw_logits = logits = logits.astype(jnp.float32)
    if flags.apply_penalties:
        logits = apply_logit_adjustments(logits, batch)
    token_ids = row_argmax(logits)
    if flags.mode != "greedy":
        is_greedy = batch.temperatures == 0.0
        scaled = logits / jnp.where(is_greedy, 1.0, batch.temperatures)[:, None]
        scaled = _apply_min_p(scaled, batch.min_ps)
        if flags.mode == "top_k_top_p":
            scaled = _apply_top_k_top_p(scaled, batch.top_ks, batch.top_ps)
        # Gumbel-max: argmax(l / T + g) is a draw from softmax(l / T) over the tokens still finite.
        noisy = scaled + _gumbel_noise(batch.seed_words, batch.num_output_tokens, vocab_size)
        token_ids = jnp.where(is_greedy, token_ids, row_argmax(noisy))
    token_ids = token_ids.astype(jnp.int32)
    if not flags.return_logprobs:
        return SamplerOutput(token_ids)
    raw_logprobs = jax.nn.log_softmax(raw_logits, axis=-1)
    logprobs = jnp.take_along_axis(raw_logprobs, token_ids[:, None], axis=-1)[:, 0]
    # Exact even when the sampled id is outside the top-k returned: one comparison pass over the vocabulary.
    ranks = jnp.sum(raw_logprobs >= logprobs[:, None], axis=-1, dtype=jnp.int32)
    top_logprobs, top_logprob_ids = jax.lax.top_k(raw_logprobs, min(MAX_LOGPROBS, vocab_size))
    return SamplerOutput(token_ids, logprobs, top_logprob_ids.astype(jnp.int32), top_logprobs, ranks)
