"""The jitted, batched sampler: logits of the sampling rows in, token ids (and asked-for logprobs) out.

Per row, in vLLM V1's order: logit_bias and suppressed ids, then repetition, frequency and presence
penalties; greedy rows take the argmax there. Sampling rows then divide by the temperature, apply min_p,
then top_k and top_p, and draw with the Gumbel-max trick. Returned logprobs are log_softmax of the *raw*
logits (before any of the above), like vLLM's default.

Each row's randomness comes from its own key, fold_in(key(seed), num_output_tokens), and nothing else, so
a seeded request samples the same tokens whatever else is in the batch and whichever row it sits in.

The host side (SamplingRow, build_sampling_batch, the flags) lives in sampling_batch.py and is re-exported
here, so callers import everything from this module.
"""

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, UInt32

from jaxpaged.runner.sampling_batch import (SAMPLING_MODES, SamplerFlags, SamplingBatch, SamplingRow,
                                            all_sampler_flag_variants, build_sampling_batch,
                                            min_tokens_suppress_ids, sampler_static_flags,
                                            seed_to_key_data, warmup_sampling_batch)
from jaxpaged.sampling_params import MAX_LOGPROBS

__all__ = [
    "SAMPLING_MODES", "SamplerFlags", "SamplerOutput", "SamplingBatch", "SamplingRow",
    "all_sampler_flag_variants", "apply_logit_adjustments", "build_sampling_batch",
    "min_tokens_suppress_ids", "sample", "sampler_static_flags", "seed_to_key_data",
    "warmup_sampling_batch",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """What one sampler call returns, per padded row (padded rows hold meaningless values)."""

    token_ids: Int[Array, "num_rows"]
    """The sampled token id (int32)."""
    logprobs: Float[Array, "num_rows"]
    """log_softmax of the raw logits at the sampled id."""
    top_logprob_ids: Optional[Int[Array, "num_rows num_top_logprobs"]] = None
    """Ids of the min(20, vocab) most likely tokens under the raw logits, best first; None if not asked."""
    top_logprobs: Optional[Float[Array, "num_rows num_top_logprobs"]] = None
    """Their raw logprobs, best first; None if not asked."""


def apply_logit_adjustments(logits: Float[Array, "num_rows vocab_size"],
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
                 min_ps: Float[Array, "num_rows"]) -> Float[Array, "num_rows vocab_size"]:
    # p_i >= min_p * p_max  <=>  l_i - l_max >= log(min_p): no softmax needed, and log(0) = -inf keeps all.
    max_logits = jnp.max(scaled_logits, axis=-1, keepdims=True)
    keep = scaled_logits - max_logits >= jnp.log(min_ps)[:, None]
    return jnp.where(keep, scaled_logits, -jnp.inf)


def _apply_top_k_top_p(scaled_logits: Float[Array, "num_rows vocab_size"], top_ks: Int[Array, "num_rows"],
                       top_ps: Float[Array, "num_rows"]) -> Float[Array, "num_rows vocab_size"]:
    """Keeps the top_k best tokens, then the smallest head of them whose probability mass reaches top_p."""
    vocab_size = scaled_logits.shape[-1]
    sorted_logits = jnp.flip(jnp.sort(scaled_logits, axis=-1), axis=-1)
    ranks = jnp.arange(vocab_size)[None, :]
    in_top_k = ranks < jnp.where(top_ks > 0, top_ks, vocab_size)[:, None]
    sorted_logits = jnp.where(in_top_k, sorted_logits, -jnp.inf)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    # Mass strictly before each rank (exclusive cumsum): the best token always stays, since 0 < top_p.
    # cummax guards against float rounding making it non-monotone, so `keep` below is a head.
    mass_before = jax.lax.cummax(jnp.cumsum(probs, axis=-1) - probs, axis=1)
    # NOTE: top_p == 1 must keep everything; f32 cumsum can reach 1.0 before the tail ends.
    keep = in_top_k & ((mass_before < top_ps[:, None]) | (top_ps[:, None] >= 1.0))
    num_kept = jnp.maximum(jnp.sum(keep, axis=-1), 1)
    # Both filters keep a head of the sorted order, so one threshold per row applies them; ties at the
    # threshold are all kept.
    threshold = jnp.take_along_axis(sorted_logits, (num_kept - 1)[:, None], axis=-1)
    return jnp.where(scaled_logits >= threshold, scaled_logits, -jnp.inf)


def _gumbel_noise(key_data: UInt32[Array, "num_rows 2"], num_output_tokens: Int[Array, "num_rows"],
                  vocab_size: int) -> Float[Array, "num_rows vocab_size"]:
    """Independent Gumbel(0, 1) noise per row from (seed, step) alone."""
    def one_row(words, step):
        # The impl is named so the draws do not depend on jax_default_prng_impl (e.g. rbg on TPU).
        key = jax.random.fold_in(jax.random.wrap_key_data(words, impl="threefry2x32"), step)
        return jax.random.gumbel(key, (vocab_size,), jnp.float32)
    return jax.vmap(one_row)(key_data, num_output_tokens + jnp.arange(key_data.shape[0]))


@functools.partial(jax.jit, static_argnames=("flags",))
def sample(logits: Float[Array, "num_rows vocab_size"], batch: SamplingBatch,
           flags: SamplerFlags) -> SamplerOutput:
    """Samples one token per row; compiled once per (row bucket, vocab_size, flags)."""
    num_rows, vocab_size = logits.shape
    if batch.temperatures.shape != (num_rows,):
        raise ValueError(f"batch: expected {num_rows} rows like logits, got {batch.temperatures.shape}")
    logits = logits.astype(jnp.float32)
    raw_logprobs = jax.nn.log_softmax(logits, axis=-1)
    if flags.apply_penalties:
        logits = apply_logit_adjustments(logits, batch)
    token_ids = jnp.argmax(logits, axis=-1)
    if flags.mode != "greedy":
        is_greedy = batch.temperatures == 0.0
        scaled = logits / jnp.where(is_greedy, 1.0, batch.temperatures)[:, None]
        scaled = _apply_min_p(scaled, batch.min_ps)
        if flags.mode == "top_k_top_p":
            scaled = _apply_top_k_top_p(scaled, batch.top_ks, batch.top_ps)
        # Gumbel-max: argmax(l / T + g) is a draw from softmax(l / T) over the tokens still finite.
        noisy = scaled + _gumbel_noise(batch.key_data, batch.num_output_tokens, vocab_size)
        token_ids = jnp.where(is_greedy, token_ids, jnp.argmax(noisy, axis=-1))
    token_ids = token_ids.astype(jnp.int32)
    logprobs = jnp.take_along_axis(raw_logprobs, token_ids[:, None], axis=-1)[:, 0]
    if not flags.return_top_logprobs:
        return SamplerOutput(token_ids, logprobs)
    top_logprobs, top_logprob_ids = jax.lax.top_k(raw_logprobs, min(MAX_LOGPROBS, vocab_size))
    return SamplerOutput(token_ids, logprobs, top_logprob_ids.astype(jnp.int32), top_logprobs)
