"""CompiledStep: the device side of a step: the model's jitted forward, one executable per bucket compiled at
warm-up, the weights it reads and the previous step's sampled ids that async scheduling feeds into it.

The step takes its inputs as one int32 array (batch.py pack_step_inputs), cut into StepInputs by the bucket's static
PackedLayout, and donates the KV pool (kv_pool.py) so XLA updates it in place. Where the runner meets the model is
this module's top: place_model() builds it, forward_step() runs it.
"""

import functools
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Int
from tqdm.auto import tqdm

from jaxpaged.lora.slots import LoRASlots
from jaxpaged.models.layers import paged_attention
from jaxpaged.models.llama import DecoderLayers
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.registry import resolve
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.batch import PackedLayout, StepInputs, pack_step_inputs, unpack_step_inputs
from jaxpaged.runner.buckets import Bucket
from jaxpaged.runner.kv_pool import KVPool
from jaxpaged.runner.startup import StartupPlan
from jaxpaged.runner.step_inputs import StepInputBuilder
from jaxpaged.runner.zero_padded import HostWeight
from jaxpaged.sampling.prompt_logprobs import PromptLogprobStats, empty_prompt_logprob_stats, prompt_logprob_stats

MAX_PARALLEL_COMPILES = 4
"""Compiles run at once during warm-up, at most: each holds its own module and compiler state in host memory."""


# ---- the model, as the runner sees it ----------------------------------------------------------------------------

def place_model(params: Mapping[str, HostWeight], model_config: ModelConfig, plan: StartupPlan,
                mesh: jax.sharding.Mesh, lora: Optional[LoRASlots] = None) -> tuple[nnx.GraphDef, dict[str, Any]]:
    """The weights on the rank's devices, arranged and packed as planned: the model's graph definition and its
    state as a plain dict of arrays. `lora`: adapter slots the model's projections read (state["lora"])."""
    placed = mesh_lib.place_params(params, model_config, mesh, plan.dtype, per_layer=plan.per_layer,
                                   pack=plan.packed_weights, pack_int8=plan.packed_int8,
                                   int8_vnni=plan.int8_matmul in ("vnni w8a8", "vnni digits"),
                                   int8_pairs=plan.int8_matmul == "bf16 panels")
    model_class = resolve(model_config.architecture).model_class  # the architecture's (models/registry.py)
    # A model with blocks that run per shard (a mixture of experts: models/moe_decoder.py) is handed the mesh.
    per_shard = {"mesh": mesh} if getattr(model_class, "takes_mesh", False) else {}
    model = model_class(model_config, placed, packed=plan.packed_weights, int8_matmul=plan.int8_matmul, **per_shard)
    if lora is not None:
        # Declared None (static) in LlamaForCausalLM, which every registered family's class is or extends.
        model.lora = nnx.data(DecoderLayers(lora.placed))  # pyright: ignore[reportAttributeAccessIssue]
    graphdef, state = nnx.split(model)
    # A plain dict of arrays: every step flattens it to call the executable, and nnx's Variables flatten in
    # Python, several times slower than the dict for a model's per-layer weights.
    return graphdef, nnx.to_pure_dict(state)


def forward_step(graphdef, attend: Callable, state, kv_cache, packed_batch: Int[Array, " total"],
                 previous_tokens: Int[Array, " max_num_seqs"], layout: PackedLayout,
                 kv_placement: Optional[tuple[tuple[int, int], ...]] = None):
    """One step of the model: (the sampling rows' logits, the updated KV pool, the prompt-logprob stats).
    `kv_placement`: per layer, its KV layer group and pool slot (KVSpec.layer_placement) when there are several
    groups."""
    batch = unpack_step_inputs(packed_batch, layout)
    model = nnx.merge(graphdef, state)
    # Async scheduling: rows whose token the previous step sampled take it from that step's output, on the device.
    sources = batch.token_sources
    token_ids = jnp.where(sources >= 0, previous_tokens[jnp.maximum(sources, 0)], batch.token_ids)
    groups = {} if kv_placement is None else {"group_tables": batch.group_tables, "kv_placement": kv_placement}
    x, kv_cache = model.hidden_states(kv_cache, token_ids, batch.positions, batch.attention, attend=attend,
                                      lora_slots=batch.lora_slots, **groups)
    logits = model.logits(x[batch.sample_indices], num_rows=batch.num_sampled_rows())
    targets = batch.prompt_logprob_targets
    vocab_size = logits.shape[-1]
    prompt_stats = jax.lax.cond(jnp.any(targets >= 0),
                                lambda h: prompt_logprob_stats(model.logits(h), targets),
                                lambda h: empty_prompt_logprob_stats(h.shape[0], vocab_size), x)
    return logits, kv_cache, prompt_stats


def _pad_rows(sampled: Int[Array, " num_rows"], size: int) -> Int[Array, " size"]:
    return jnp.zeros(size, jnp.int32).at[:sampled.shape[0]].set(sampled)


# ---- the compiled step -------------------------------------------------------------------------------------------

class CompiledStep:
    """The jitted step of one rank, its executables (one per bucket) and the weights they read."""

    def __init__(self, graphdef: nnx.GraphDef, state: dict[str, Any], plan: StartupPlan, mesh: jax.sharding.Mesh,
                 pool: KVPool, inputs: StepInputBuilder) -> None:
        """Jit the step with explicit shardings, so the executables compiled at warm-up serve every call."""
        self.state = state
        """The placed weights, a plain dict of arrays."""
        self._pool = pool
        self._inputs = inputs
        self._replicated = mesh_lib.replicated(mesh)
        self._inputs_need_device_put = jax.process_count() > 1
        """The compiled step takes the packed numpy inputs as they are (its own transfer costs a fraction of
        jax.device_put's, ~20 against ~50 us); a mesh over several processes needs them put as a global array."""
        attend = functools.partial(paged_attention, backend=plan.attention_backend, native_decode=plan.native_decode,
                                   kv_cache_dtype=plan.kv_cache_dtype, page_size=plan.kv_spec.block_size)
        if plan.tensor_parallel_size > 1:
            attend = mesh_lib.shard_attention(attend, mesh)
        state_shardings = jax.tree.map(lambda x: x.sharding, state)
        replicated = self._replicated
        kv_sharding = pool.sharding
        step = functools.partial(forward_step, graphdef, attend)
        if plan.kv_spec.num_groups > 1:
            step = functools.partial(step, kv_placement=plan.kv_spec.layer_placement)
        self._jitted = jax.jit(step, donate_argnums=(1,),
                               static_argnums=(4,), in_shardings=(state_shardings, kv_sharding, replicated, replicated),
                               out_shardings=(replicated, kv_sharding, replicated))
        self._executables: dict[Bucket, jax.stages.Compiled] = {}
        max_num_seqs = inputs.ladder.max_num_seqs
        self._no_previous_tokens = jax.device_put(np.zeros(max_num_seqs, np.int32), replicated)
        self._pad_sampled = jax.jit(functools.partial(_pad_rows, size=max_num_seqs), out_shardings=replicated)
        self.previous_sampled: Optional[jax.Array] = None
        """The last launched step's sampled ids, on the device (async scheduling)."""

    def executable(self, bucket: Bucket) -> Callable:
        """The bucket's compiled step (compiled on first use; warm-up compiles them all)."""
        if bucket not in self._executables:
            example = self._inputs.empty(bucket)
            packed = jax.device_put(pack_step_inputs(example), self._replicated)
            self._executables[bucket] = self._jitted.lower(self.state, self._pool.cache, packed,
                                                           self._no_previous_tokens, PackedLayout.of(example)).compile()
        return self._executables[bucket]

    def run(self, bucket: Bucket, host_batch: StepInputs, previous_tokens: Optional[Int[Array, " max_num_seqs"]] = None,
            ) -> tuple[jax.Array, PromptLogprobStats]:
        """Run the bucket's step on a built batch, updating the KV pool in place: the sampled rows' logits and the
        prompt-logprob stats (zeros unless a row has a target). `previous_tokens`: the ids host_batch.token_sources
        points into (async scheduling)."""
        packed = pack_step_inputs(host_batch)  # one array, one transfer
        if self._inputs_need_device_put:
            packed = jax.device_put(packed, self._replicated)
        if previous_tokens is None:
            previous_tokens = self._no_previous_tokens
        pool = self._pool
        logits, pool.cache, prompt_stats = self.executable(bucket)(self.state, pool.cache, packed, previous_tokens)
        return logits, prompt_stats

    def replace_lora_slots(self, lora: LoRASlots) -> None:
        """Read the adapter slots' new device arrays from the next step on (same shapes and shardings: no compile)."""
        self.state["lora"] = nnx.to_pure_dict(nnx.state(DecoderLayers(lora.placed)))

    def previous_tokens(self) -> Int[Array, " max_num_seqs"]:
        """The previous step's sampled ids, padded to max_num_seqs rows (the step's previous_tokens argument)."""
        sampled = self.previous_sampled
        assert sampled is not None, "a row takes its token from a step that sampled nothing"
        if sampled.shape[0] == self._inputs.ladder.max_num_seqs:
            return sampled
        return self._pad_sampled(sampled)

    def warmup_tasks(self) -> list[Callable[[], object]]:
        """Compiling every bucket's step, longest first."""
        return [functools.partial(self.executable, bucket) for bucket in self._inputs.ladder.buckets()]

    def pad_tasks(self, placement: jax.sharding.Sharding) -> list[Callable[[], object]]:
        """Compiling the padding of previous_tokens() for each row count below max_num_seqs (async scheduling;
        `placement`: where the sampler puts its ids)."""
        ladder = self._inputs.ladder
        row_counts = {bucket.num_seqs for bucket in ladder.buckets()} - {ladder.max_num_seqs}
        return [functools.partial(self._compile_pad, num_rows, placement) for num_rows in sorted(row_counts)]

    def _compile_pad(self, num_rows: int, placement: jax.sharding.Sharding) -> None:
        sampled = jax.device_put(np.zeros(num_rows, np.int32), placement)
        jax.block_until_ready(self._pad_sampled(sampled))


def compile_all(tasks: Iterable[Callable[[], object]], progress: Optional[bool] = None) -> None:
    """Run the compile tasks, several side by side on one process; `progress`: a bar of programs compiled on stderr
    (None: when stderr is a terminal)."""
    tasks = list(tasks)
    # Side by side, the long step compiles first: tracing holds the GIL, but XLA's compile (or its
    # persistent-cache load) releases it and is most of the time (the warm-up gain is in docs/performance.md).
    # With several processes the order stays fixed: each must build the same programs.
    workers = min(len(tasks), os.cpu_count() or 1, MAX_PARALLEL_COMPILES) if jax.process_count() == 1 else 1
    bar = tqdm(total=len(tasks), desc="Compiling", unit="program", file=sys.stderr, leave=False,
               disable=None if progress is None else not progress)
    with bar, ThreadPoolExecutor(workers, thread_name_prefix="jaxpaged-compile") as pool:
        for future in as_completed([pool.submit(task) for task in tasks]):
            future.result()  # re-raises a failed compile
            bar.update(1)
