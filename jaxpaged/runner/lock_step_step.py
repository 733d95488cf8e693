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


def join_ranks(batch: StepInputs) -> StepInputs:
    """Every field of a [ranks, ...] batch joined rank-major on its row axis: rank r's token rows become rows
    r * num_tokens onwards, its sequences r * max_num_seqs onwards (the metadata keeps each rank's own offsets and
    block ids: attention reads it per rank); the sampled rows point at the joined token rows."""
    num_ranks, num_tokens = batch.token_ids.shape

    def joined(leaf: HostOrDeviceArray) -> jax.Array:
        return jnp.reshape(leaf, (num_ranks * leaf.shape[1], *leaf.shape[2:]))

    offsets = (jnp.arange(num_ranks, dtype=jnp.int32) * num_tokens)[:, None]
    group_tables = batch.group_tables
    if group_tables is not None:  # [ranks, groups, rows, ...]: joined on the rows, after the group axis
        group_tables = GroupTables(*(jnp.swapaxes(leaf, 0, 1).reshape(leaf.shape[1], -1, *leaf.shape[3:])
                                     for leaf in (group_tables.block_tables, group_tables.slot_mapping)))
    return StepInputs(token_ids=joined(batch.token_ids), positions=joined(batch.positions),
                      attention=jax.tree.map(joined, batch.attention),
                      sample_indices=joined(batch.sample_indices + offsets),
                      prompt_logprob_targets=joined(batch.prompt_logprob_targets),
                      token_sources=joined(batch.token_sources), lora_slots=joined(batch.lora_slots),
                      group_tables=group_tables)


def forward_ranks_step(graphdef, attend: Callable, state, kv_cache, packed_batches: Int[Array, "ranks total"],
                       layout: PackedLayout, kv_placement: Optional[tuple[tuple[int, int], ...]] = None):
    """One lock step of every rank: (each rank's sampling rows' logits, the updated pool, the prompt-logprob stats of
    the joined rows). No row takes its token from the previous step (lock step runs without async scheduling), no
    LoRA, and the model's num_rows is not read by the XLA dot the plan runs (runner/lock_step.py says why)."""
    num_ranks = packed_batches.shape[0]
    batch = join_ranks(jax.vmap(functools.partial(unpack_step_inputs, layout=layout))(packed_batches))
    model = nnx.merge(graphdef, state)
    groups = {} if kv_placement is None else {"group_tables": batch.group_tables, "kv_placement": kv_placement}
    x, kv_cache = model.hidden_states(kv_cache, batch.token_ids, batch.positions, batch.attention, attend=attend,
                                      **groups)
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
        self._jitted = jax.jit(step, donate_argnums=(1,), static_argnums=(3,),
                               in_shardings=(jax.tree.map(lambda x: x.sharding, state), pool.sharding, self._rows),
                               out_shardings=((replicated,) * self.num_ranks, pool.sharding, replicated))
        self._executables: dict[Bucket, jax.stages.Compiled] = {}

    def executable(self, bucket: Bucket) -> Callable:
        """The bucket's compiled step (compiled on first use; warm-up compiles them all)."""
        if bucket not in self._executables:
            example = self._inputs.empty(bucket)
            packed = jax.device_put(np.stack([pack_step_inputs(example)] * self.num_ranks), self._rows)
            self._executables[bucket] = self._jitted.lower(self.state, self._pool.cache, packed,
                                                           PackedLayout.of(example)).compile()
        return self._executables[bucket]

    def run(self, bucket: Bucket, host_batches: Sequence[StepInputs],
            ) -> tuple[tuple[jax.Array, ...], PromptLogprobStats]:
        """Run the bucket's step on every rank's built batch (each padded to `bucket`), updating the pool in place:
        each rank's sampled rows' logits, and the prompt-logprob stats of the joined rows (rank r's row i at
        r * bucket.num_tokens + i)."""
        assert all(np.all(batch.token_sources < 0) for batch in host_batches), "lock step runs without async"
        packed = jax.device_put(np.stack([pack_step_inputs(batch) for batch in host_batches]), self._rows)
        pool = self._pool
        logits, pool.cache, prompt_stats = self.executable(bucket)(self.state, pool.cache, packed)
        return logits, prompt_stats

    def warmup_tasks(self) -> list[Callable[[], object]]:
        """Compiling every bucket's step, longest first."""
        return [functools.partial(self.executable, bucket) for bucket in self._inputs.ladder.buckets()]


def shift_prompt_rows(rows: Sequence[tuple[int, str, int]], rank: int, num_tokens: int,
                      ) -> list[tuple[int, str, int]]:
    """A rank's (token row, request id, prompt position) triples as rows of the joined batch."""
    return [(row + rank * num_tokens, request_id, position) for row, request_id, position in rows]
