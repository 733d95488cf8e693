"""Prompt logprobs in the compiled step: for the rows whose request asked for them, the log-probability of the
next prompt token, its rank and the top alternatives (vLLM's prompt_logprobs; what `echo` + `logprobs` scoring
and lm-evaluation-harness's loglikelihood tasks read).

The step computes them under a lax.cond on "some row has a target", so steps without such a request skip the
whole-vocabulary projection of every token; the outputs keep one fixed shape either way (nothing recompiles).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.sampling.params import MAX_LOGPROBS
from pallas_kernels.pytree import HostOrDeviceArray, register_pytree_dataclass


@register_pytree_dataclass
@dataclasses.dataclass
class PromptLogprobStats:
    """Per token row of a step; rows without a target hold zeros."""

    target_logprobs: Float[HostOrDeviceArray, " num_tokens"]
    """log_softmax of the row's logits at its target (the next prompt token)."""
    target_ranks: Int[HostOrDeviceArray, " num_tokens"]
    """1-based rank of the target (vLLM's: tokens at least as likely, itself included)."""
    top_ids: Int[HostOrDeviceArray, "num_tokens num_top"]
    """The row's most likely tokens, best first."""
    top_logprobs: Float[HostOrDeviceArray, "num_tokens num_top"]
    """Their logprobs."""


def num_top(vocab_size: int) -> int:
    return min(MAX_LOGPROBS, vocab_size)


def prompt_logprob_stats(logits: Float[Array, "num_tokens vocab"],
                         targets: Int[HostOrDeviceArray, " num_tokens"]) -> PromptLogprobStats:
    """The stats of every row (targets < 0 read token 0; the host ignores those rows)."""
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    target = jnp.take_along_axis(logprobs, jnp.maximum(targets, 0)[:, None], axis=-1)
    ranks = jnp.sum(logprobs >= target, axis=-1, dtype=jnp.int32)
    top_logprobs, top_ids = jax.lax.top_k(logprobs, num_top(logits.shape[-1]))
    return PromptLogprobStats(target[:, 0], ranks, top_ids.astype(jnp.int32), top_logprobs)


def empty_prompt_logprob_stats(num_tokens: int, vocab_size: int) -> PromptLogprobStats:
    """The fixed-shape zeros a step without prompt-logprob rows returns."""
    k = num_top(vocab_size)
    return PromptLogprobStats(jnp.zeros(num_tokens, jnp.float32), jnp.zeros(num_tokens, jnp.int32),
                              jnp.zeros((num_tokens, k), jnp.int32), jnp.zeros((num_tokens, k), jnp.float32))


@dataclasses.dataclass(frozen=True)
class PromptLogprobEntry:
    """One prompt token's logprob, as the host hands it to the engine."""

    request_id: str
    position: int
    """Index of the token in the prompt (>= 1: the first prompt token has none)."""
    logprob: float
    rank: int
    top: list[tuple[int, float]]
    """(token id, logprob) of the most likely tokens at that position, best first (MAX_LOGPROBS of them)."""


def host_entries(stats: PromptLogprobStats, rows: list[tuple[int, str, int]]) -> list[PromptLogprobEntry]:
    """Pull a step's stats to the host for `rows` ((token row, request id, prompt position) triples)."""
    if not rows:
        return []
    indices = np.asarray([row for row, _, _ in rows])
    logprobs = np.asarray(stats.target_logprobs)[indices].tolist()
    ranks = np.asarray(stats.target_ranks)[indices].tolist()
    top_ids = np.asarray(stats.top_ids)[indices].tolist()
    top_values = np.asarray(stats.top_logprobs)[indices].tolist()
    return [PromptLogprobEntry(request_id, position, logprobs[i], ranks[i], list(zip(top_ids[i], top_values[i])))
            for i, (_, request_id, position) in enumerate(rows)]
