"""StubDevice: an engine's device work replaced by a step of known length that leaves the host's cores alone.

For the host-path benchmark (host_path.py). On a CPU machine the "device" is the host's own cores: a real model
step and a real sampler over a 49k vocabulary take tens of milliseconds there and stream ~50 MB through the caches
the host's Python then runs from cold. An accelerator runs them elsewhere. The stub keeps every host-side call the
engine makes (the packed inputs go to a jitted step with the same arguments, the sampling batch to a jitted
sampler with the same pytree, the grammar bitmask too) but the programs do almost nothing: the step returns
one-column logits; the sampler draws a hashed token per row from its seed and token count (a real token, so
detokenization is real work), and for a row under a grammar the first token its bitmask allows at or after that
draw. XLA's CPU client runs programs this small in the caller's thread, so the device's time is a clock instead:
each step's model is done `device_step_s` after the later of its dispatch and the step before it (a device runs
its queue in order), its tokens once the sampler is dispatched too, and waiting for them sleeps until then.
"""

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp

from jaxpaged.sampling import token_sampler
from jaxpaged.sampling.params import MAX_LOGPROBS
from jaxpaged.sampling.prompt_logprobs import empty_prompt_logprob_stats
from jaxpaged.sampling.sampler import SamplerFlags, SamplerOutput, SamplingBatch

FIRST_TOKEN, NUM_TOKENS = 100, 40_000
"""The stub samples ids in [FIRST_TOKEN, FIRST_TOKEN + NUM_TOKENS): ordinary tokens of SmolLM2's vocabulary."""


@functools.partial(jax.jit, static_argnames=("num_rows", "num_tokens", "vocab_size"), donate_argnums=(1,))
def _stub_step(state: Any, kv_cache: jax.Array, packed: jax.Array, previous_tokens: jax.Array, *, num_rows: int,
               num_tokens: int, vocab_size: int):
    del state  # an argument all the same: the real step flattens the weights on every call, and so does this
    first = (packed[0] + previous_tokens[0]).astype(jnp.float32)
    logits = jnp.zeros((num_rows, 1), jnp.float32) + first * 0.0
    return logits, kv_cache, empty_prompt_logprob_stats(num_tokens, vocab_size)


def _hashed_tokens(batch: SamplingBatch) -> jax.Array:
    """A token per row hashed from its seed and count, log-uniform over NUM_TOKENS ids (text's ids follow Zipf's
    law: a few thousand distinct ones make most of it, which is what per-token caches see)."""
    mixed = (batch.seed_words[:, 1] * jnp.uint32(2654435761)
             + batch.num_output_tokens.astype(jnp.uint32) * jnp.uint32(40503))
    uniform = (mixed >> jnp.uint32(8)).astype(jnp.float32) / jnp.float32(2 ** 24)
    rank = jnp.floor(jnp.exp(uniform * jnp.log(jnp.float32(NUM_TOKENS)))).astype(jnp.int32)
    return jnp.minimum(rank, NUM_TOKENS) - 1 + FIRST_TOKEN


def _first_allowed_from(words: jax.Array, start: jax.Array) -> jax.Array:
    """Per row, the first token the bitmask allows at or after the word holding `start` (cyclically)."""
    num_words = words.shape[1]
    offsets = (jnp.arange(num_words)[None, :] - (start // 32)[:, None]) % num_words
    word_index = jnp.argmin(jnp.where(words != 0, offsets, num_words), axis=1)
    word = jnp.take_along_axis(words, word_index[:, None], axis=1)[:, 0]
    lowest_bit = jax.lax.population_count((word & -word) - 1)
    return (word_index * 32 + lowest_bit).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("flags",))
def _stub_sample(logits: Any, batch: SamplingBatch, flags: SamplerFlags) -> SamplerOutput:
    token_ids = _hashed_tokens(batch)
    if isinstance(logits, tuple):  # the constrained rows' bitmasks and indices (_stub_bitmask passes them on)
        bitmask, rows = logits
        allowed = _first_allowed_from(bitmask, token_ids[jnp.minimum(rows, token_ids.shape[0] - 1)])
        token_ids = token_ids.at[rows].set(allowed, mode="drop")  # padding entries point past the last row
    if not flags.return_logprobs:
        return SamplerOutput(token_ids)
    rows = token_ids.shape[0]
    top_ids = token_ids[:, None] + jnp.arange(MAX_LOGPROBS, dtype=jnp.int32)[None, :]
    return SamplerOutput(token_ids, jnp.zeros(rows, jnp.float32), top_ids, jnp.zeros((rows, MAX_LOGPROBS)),
                         jnp.ones(rows, jnp.int32))


@jax.jit
def _stub_bitmask(logits: jax.Array, bitmask: jax.Array, rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    del logits
    return bitmask, rows


class StubDevice:
    """Installs the stub step and the device clock on a runner, and the stub sampler in the token sampler's
    module; restore() undoes the sampler's (the runner is the benchmark's own)."""

    def __init__(self, runner, device_step_s: float) -> None:
        self.device_step_s = device_step_s
        self.busy_until = 0.0
        """perf_counter time at which the device finishes the last step launched."""
        forward, sample = runner.forward, runner.sample

        def clocked_forward(plan):
            step = forward(plan)
            step.ready_at = self.busy_until = max(time.perf_counter(), self.busy_until) + device_step_s
            return step

        def clocked_sample(step):
            pending = sample(step)
            # A deferred sampler dispatched after the model finished adds its own (negligible) time only.
            ready_at = max(getattr(step, "ready_at", 0.0), time.perf_counter())
            pending.is_running = lambda: time.perf_counter() < ready_at
            pending.wait = lambda: time.sleep(max(0.0, ready_at - time.perf_counter()))
            return pending

        runner.forward, runner.sample = clocked_forward, clocked_sample
        self._saved = (token_sampler.sample, token_sampler.apply_token_bitmask)
        token_sampler.sample = _stub_sample
        token_sampler.apply_token_bitmask = _stub_bitmask
        vocab_size = runner.sampler.vocab_size

        def executable(bucket):
            return functools.partial(_stub_step, num_rows=bucket.num_seqs, num_tokens=bucket.num_tokens,
                                     vocab_size=vocab_size)

        runner.step.executable = executable

    def restore(self) -> None:
        token_sampler.sample, token_sampler.apply_token_bitmask = self._saved
