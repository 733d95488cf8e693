"""LockStepCompiledStep: the one jitted step of data-parallel ranks in lock step (runner/lock_step.py), over the
(dp, tp) mesh, one executable per bucket.

Every rank's host batch is padded to the same bucket and packed as one int32 row (batch.py pack_step_inputs); the
rows are stacked [ranks, total] and split over the data axis, so each rank's inputs travel to its own devices only.
On the device each row is cut back into a StepInputs and the ranks' fields are joined rank-major into one batch of
ranks * num_tokens rows: the token-wise layers run on it as on one rank's (GSPMD keeps each rank's rows on its
data shard), attention runs per (rank, model shard) on the rank's own metadata and pool slots
(mesh.shard_attention), and the experts see every rank's rows (models/moe.py run_over_ranks).
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Int

from jaxpaged.models.layers import paged_attention
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.batch import GroupTables, PackedLayout, StepInputs, pack_step_inputs, unpack_step_inputs
from jaxpaged.runner.buckets import Bucket
from jaxpaged.runner.kv_pool import KVPool
from jaxpaged.runner.startup import StartupPlan
from jaxpaged.runner.step_inputs import StepInputBuilder
from jaxpaged.sampling.prompt_logprobs import PromptLogprobStats, empty_prompt_logprob_stats, prompt_logprob_stats
from pallas_kernels.pytree import HostOrDeviceArray


def join_ranks(batch: StepInputs, previous_rows: int) -> StepInputs:
    """Every field of a [ranks, ...] batch joined rank-major on its row axis: rank r's token rows become rows
    r * num_tokens onwards, its sequences r * max_num_seqs onwards (the metadata keeps each rank's own offsets and
    block ids: attention reads it per rank); the sampled rows point at the joined token rows, and the token sources
    at the joined previous sampled ids (`previous_rows` per rank)."""
    num_ranks, num_tokens = batch.token_ids.shape

    def joined(leaf: HostOrDeviceArray) -> jax.Array:
        return jnp.reshape(leaf, (num_ranks * leaf.shape[1], *leaf.shape[2:]))

    rank = jnp.arange(num_ranks, dtype=jnp.int32)[:, None]
    group_tables = batch.group_tables
    if group_tables is not None:  # [ranks, groups, rows, ...]: joined on the rows, after the group axis
        group_tables = GroupTables(*(jnp.swapaxes(leaf, 0, 1).reshape(leaf.shape[1], -1, *leaf.shape[3:])
                                     for leaf in (group_tables.block_tables, group_tables.slot_mapping)))
    return StepInputs(token_ids=joined(batch.token_ids), positions=joined(batch.positions),
                      attention=jax.tree.map(joined, batch.attention),
                      sample_indices=joined(batch.sample_indices + rank * num_tokens),
                      prompt_logprob_targets=joined(batch.prompt_logprob_targets),
                      token_sources=joined(jnp.where(batch.token_sources >= 0,
                                                     batch.token_sources + rank * previous_rows, -1)),
                      lora_slots=joined(batch.lora_slots),
                      group_tables=group_tables)


def forward_ranks_step(graphdef, attend: Callable, state, kv_cache, packed_batches: Int[Array, "ranks total"],
                       previous_tokens: Int[Array, "ranks max_num_seqs"], layout: PackedLayout,
                       kv_placement: Optional[tuple[tuple[int, int], ...]] = None):
    """One lock step of every rank: (each rank's sampling rows' logits, the updated pool, the prompt-logprob stats of
    the joined rows). Async scheduling: a row in flight takes its token from its rank's row of `previous_tokens`. No
    LoRA, and the model's num_rows is not read by the XLA dot the plan runs (runner/lock_step.py says why)."""
    num_ranks, previous_rows = previous_tokens.shape
    batch = join_ranks(jax.vmap(functools.partial(unpack_step_inputs, layout=layout))(packed_batches), previous_rows)
    model = nnx.merge(graphdef, state)
    sources = batch.token_sources
    token_ids = jnp.where(sources >= 0, previous_tokens.reshape(-1)[jnp.maximum(sources, 0)], batch.token_ids)
    groups = {} if kv_placement is None else {"group_tables": batch.group_tables, "kv_placement": kv_placement}
    x, kv_cache = model.hidden_states(kv_cache, token_ids, batch.positions, batch.attention, attend=attend, **groups)
    logits = model.logits(x[batch.sample_indices])
    targets = batch.prompt_logprob_targets
    vocab_size = logits.shape[-1]
    prompt_stats = jax.lax.cond(jnp.any(targets >= 0),
                                lambda h: prompt_logprob_stats(model.logits(h), targets),
                                lambda h: empty_prompt_logprob_stats(h.shape[0], vocab_size), x)
    return tuple(logits.reshape(num_ranks, -1, vocab_size)), kv_cache, prompt_stats


class LockStepCompiledStep:
    """The jitted lock step of every rank, its executables (one per bucket) and the weights they read."""

    def __init__(self, graphdef: nnx.GraphDef, state: dict[str, Any], plan: StartupPlan, mesh: jax.sharding.Mesh,
                 pool: KVPool, inputs: StepInputBuilder) -> None:
        """Jit the step with explicit shardings; `inputs`: a rank's input builder (every rank's has its shapes)."""
        self.state = state
        """The placed weights, a plain dict of arrays."""
        self._pool = pool
        self._inputs = inputs
        self.num_ranks = mesh.shape[mesh_lib.DATA_AXIS]
        self._rows = NamedSharding(mesh, P(mesh_lib.DATA_AXIS))
        replicated = mesh_lib.replicated(mesh)
        attend = functools.partial(paged_attention, backend=plan.attention_backend, native_decode=plan.native_decode,
                                   kv_cache_dtype=plan.kv_cache_dtype, page_size=plan.kv_spec.block_size)
        step = functools.partial(forward_ranks_step, graphdef, mesh_lib.shard_attention(attend, mesh))
        if plan.kv_spec.num_groups > 1:
            step = functools.partial(step, kv_placement=plan.kv_spec.layer_placement)
        self._jitted = jax.jit(step, donate_argnums=(1,), static_argnums=(4,),
                               in_shardings=(jax.tree.map(lambda x: x.sharding, state), pool.sharding, self._rows,
                                             self._rows),
                               out_shardings=((replicated,) * self.num_ranks, pool.sharding, replicated))
        self._executables: dict[Bucket, jax.stages.Compiled] = {}
        max_num_seqs = inputs.ladder.max_num_seqs
        self._no_previous_tokens = jax.device_put(np.zeros((self.num_ranks, max_num_seqs), np.int32), self._rows)
        self._zero_row = jax.device_put(np.zeros(max_num_seqs, np.int32), replicated)
        self._pad_sampled = jax.jit(lambda sampled: jnp.zeros(max_num_seqs, jnp.int32).at[:sampled.shape[0]].set(
            sampled), out_shardings=replicated)
        self._stack = jax.jit(lambda *rows: jnp.stack(rows), out_shardings=self._rows)
        self.previous_sampled: list[Optional[jax.Array]] = [None] * self.num_ranks
        """Each rank's last launched sampled ids, on the device (async scheduling)."""

    def executable(self, bucket: Bucket) -> Callable:
        """The bucket's compiled step (compiled on first use; warm-up compiles them all)."""
        if bucket not in self._executables:
            example = self._inputs.empty(bucket)
            packed = jax.device_put(np.stack([pack_step_inputs(example)] * self.num_ranks), self._rows)
            self._executables[bucket] = self._jitted.lower(self.state, self._pool.cache, packed,
                                                           self._no_previous_tokens, PackedLayout.of(example)).compile()
        return self._executables[bucket]

    def run(self, bucket: Bucket, host_batches: Sequence[StepInputs], feeds_previous: Sequence[bool] = (),
            ) -> tuple[tuple[jax.Array, ...], PromptLogprobStats]:
        """Run the bucket's step on every rank's built batch (each padded to `bucket`), updating the pool in place:
        each rank's sampled rows' logits, and the prompt-logprob stats of the joined rows (rank r's row i at
        r * bucket.num_tokens + i). `feeds_previous[r]`: rank r's batch has rows in flight (async scheduling)."""
        packed = jax.device_put(np.stack([pack_step_inputs(batch) for batch in host_batches]), self._rows)
        pool = self._pool
        logits, pool.cache, prompt_stats = self.executable(bucket)(self.state, pool.cache, packed,
                                                                   self.previous_tokens(feeds_previous))
        return logits, prompt_stats

    def previous_tokens(self, feeds_previous: Sequence[bool]) -> Int[Array, "ranks max_num_seqs"]:
        """Every rank's previous sampled ids padded to max_num_seqs, stacked (zeros for a rank without rows in
        flight)."""
        if not any(feeds_previous):
            return self._no_previous_tokens
        rows = []
        for rank, feeds in enumerate(feeds_previous):
            sampled = self.previous_sampled[rank] if feeds else None
            assert not feeds or sampled is not None, "a row takes its token from a step that sampled nothing"
            if sampled is None:
                rows.append(self._zero_row)
            else:
                rows.append(sampled if sampled.shape[0] == self._zero_row.shape[0] else self._pad_sampled(sampled))
        return self._stack(*rows)

    def warmup_tasks(self) -> list[Callable[[], object]]:
        """Compiling every bucket's step, longest first."""
        return [functools.partial(self.executable, bucket) for bucket in self._inputs.ladder.buckets()]

    def pad_tasks(self, placement: jax.sharding.Sharding) -> list[Callable[[], object]]:
        """Compiling previous_tokens()'s padding for each row count below max_num_seqs and its stack (async
        scheduling; `placement`: where the sampler puts its ids)."""
        ladder = self._inputs.ladder
        row_counts = sorted({bucket.num_seqs for bucket in ladder.buckets()} - {ladder.max_num_seqs})
        tasks: list[Callable[[], object]] = [functools.partial(self._compile_pad, rows, placement)
                                             for rows in row_counts]
        return tasks + [lambda: jax.block_until_ready(self._stack(*[self._zero_row] * self.num_ranks))]

    def _compile_pad(self, num_rows: int, placement: jax.sharding.Sharding) -> None:
        jax.block_until_ready(self._pad_sampled(jax.device_put(np.zeros(num_rows, np.int32), placement)))


def shift_prompt_rows(rows: Sequence[tuple[int, str, int]], rank: int, num_tokens: int,
                      ) -> list[tuple[int, str, int]]:
    """A rank's (token row, request id, prompt position) triples as rows of the joined batch."""
    return [(row + rank * num_tokens, request_id, position) for row, request_id, position in rows]
