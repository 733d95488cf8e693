"""DraftRunner: the device side of draft-model speculation (speculative_method "draft_model").

The draft is a model of its own: a ModelRunner with its own weights, KV pool, block table and bucket ladder,
compiled at warm-up like the target's, fed ragged batches the draft's host-side planner builds
(speculative/draft_model.py). Its sampling rows give their argmax: the draft proposes greedily, which is what makes
the target's verification rule exact (see docs/speculative-decoding.md).
"""

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.config import CacheConfig, EngineConfig, SchedulerConfig
from jaxpaged.core.scheduler_output import ScheduledRequest
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.weights.loader import LoadedModel


def _greedy(logits: Float[Array, "rows vocab"]) -> Int[Array, " rows"]:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class DraftShape:
    """The draft's limits, from the target's configuration."""

    max_model_len: int
    """The target's: a proposal never reaches past it (the planner caps them), so neither does the draft's KV."""
    max_num_seqs: int
    """Most requests in one draft step: the most that propose at once."""
    max_num_batched_tokens: int
    """Token budget of one draft step (catching up on a prompt is chunked within it)."""
    num_kv_blocks: int
    """The draft pool, null block included: max_num_seqs sequences of max_model_len tokens."""
    block_size: int


def draft_shape(config: EngineConfig, max_model_len: int) -> DraftShape:
    """Room for every request that may propose at once (fewer than speculative_disable_by_batch_size, at most
    max_num_seqs) to hold a whole max_model_len sequence in the draft's pool: a proposing request never waits for
    draft blocks."""
    spec, sched, block_size = config.speculative, config.scheduler, config.cache.block_size
    max_num_seqs = min(sched.max_num_seqs, spec.speculative_disable_by_batch_size - 1)
    blocks_per_seq = -(-max_model_len // block_size)
    return DraftShape(max_model_len, max_num_seqs, sched.max_num_batched_tokens,
                      1 + max_num_seqs * blocks_per_seq, block_size)


class DraftRunner:
    """Runs draft steps and returns each sampling row's argmax."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, shape: DraftShape, dtype: str):
        """`config`: the target engine's (kernels, backend, compilation cache); `dtype`: the target's resolved dtype
        (a CPU probe would otherwise run again)."""
        self.shape = shape
        draft_config = dataclasses.replace(
            config, dtype=dtype, quantization=None, tensor_parallel_size=1, data_parallel_size=1,
            async_scheduling=False, kv_events_config=None, enable_lora=False,  # the draft proposes without adapters
            cache=CacheConfig(block_size=shape.block_size, num_kv_blocks=shape.num_kv_blocks,
                              enable_prefix_caching=False,
                              disable_hybrid_kv_cache_manager=True),  # the draft keeps its own one-table pool
            scheduler=SchedulerConfig(max_num_seqs=shape.max_num_seqs,
                                      max_num_batched_tokens=shape.max_num_batched_tokens,
                                      max_model_len=shape.max_model_len))
        self.runner = ModelRunner(loaded, draft_config)
        self._greedy = jax.jit(_greedy)
        self.num_steps = 0
        """Draft steps run (the bench reports them)."""
        self.seconds = 0.0
        """Host time spent in draft steps, waiting for their ids included."""

    def warmup(self) -> float:
        """Compile every bucket's step and argmax; the seconds it took."""
        start = time.perf_counter()
        runner = self.runner
        runner.warmup(sampler=False, progress=False)
        for bucket in runner.ladder.buckets():  # an empty step writes only the null block
            batch = runner.inputs.empty(bucket)
            jax.block_until_ready(self._greedy(runner.compute_logits(bucket, batch)))
        return time.perf_counter() - start

    def greedy(self, scheduled: Sequence[ScheduledRequest]) -> list[int]:
        """Run one draft step over `scheduled` (within the draft's bucket limits); the argmax of each item that
        samples, in order."""
        start = time.perf_counter()
        runner = self.runner
        bucket, batch = runner.inputs.fill(scheduled)
        ids = np.asarray(self._greedy(runner.compute_logits(bucket, batch)))
        self.num_steps += 1
        self.seconds += time.perf_counter() - start
        return ids[:sum(1 for item in scheduled if item.sample)].tolist()


def load_draft_model(config: EngineConfig, target: LoadedModel, tokenizer: Any, max_model_len: int) -> LoadedModel:
    """The draft model config.speculative.speculative_model names, checked against the target: the same
    vocabulary and tokenizer (its proposals are token ids the target reads) and a context at least max_model_len
    long. ValueError naming speculative_model otherwise."""
    from jaxpaged.weights.loader import load_model
    from jaxpaged.weights.tokenizer_source import load_tokenizer

    path = config.speculative.speculative_model
    try:
        draft = load_model(path)
    except (ValueError, FileNotFoundError) as error:
        raise ValueError(f"speculative_model: {str(error).removeprefix('model: ')}") from error
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"speculative_model: {path!r} has a vocabulary of {draft.config.vocab_size} tokens, the "
                         f"target model {target.config.vocab_size}: the draft must share the target's tokenizer")
    if load_tokenizer(draft.tokenizer_dir).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"speculative_model: {path!r} has another tokenizer than the target model (its token ids "
                         "would mean other text)")
    if draft.config.max_position_embeddings < max_model_len:
        raise ValueError(f"speculative_model: {path!r} reads {draft.config.max_position_embeddings} positions, "
                         f"fewer than max_model_len ({max_model_len}); lower max_model_len or use another draft")
    return draft
