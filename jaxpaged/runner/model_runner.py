"""ModelRunner: SchedulerOutput -> padded numpy batch -> one transfer -> the compiled step -> sampled ids.

It owns the parameters, the KV cache (donated to every step, so XLA updates it in place), one compiled
executable per bucket and the token sampler. Warm-up compiles them all; serving then only looks them up.
"""

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Int
from tqdm.auto import tqdm

from jaxpaged.config import EngineConfig
from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.kv_tiers import KVTiers
from jaxpaged.models.int8_weights import quantize_params
from jaxpaged.models.layers import paged_attention
from jaxpaged.models.llama import LlamaForCausalLM
from jaxpaged.runner import compile_counter
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.batch import (
    PackedLayout,
    StepInputs,
    empty_step_inputs,
    pack_step_inputs,
    unpack_step_inputs,
)
from jaxpaged.runner.buckets import Bucket
from jaxpaged.runner.kv_pool import KVPool
from jaxpaged.runner.startup import log_plan, plan_startup
from jaxpaged.runner.step_inputs import StepInputBuilder
from jaxpaged.runner.tier_transfer import TierTransfer
from jaxpaged.sampling.prompt_logprobs import (
    PromptLogprobEntry,
    PromptLogprobStats,
    empty_prompt_logprob_stats,
    host_entries,
    prompt_logprob_stats,
)
from jaxpaged.sampling.step_result import StepResult
from jaxpaged.sampling.token_sampler import PendingSample, TokenSampler
from jaxpaged.weights.loader import LoadedModel


def _forward(graphdef, attend: Callable, state, kv_cache, packed_batch: Int[Array, " total"],
             previous_tokens: Int[Array, " max_num_seqs"], layout: PackedLayout):
    batch = unpack_step_inputs(packed_batch, layout)
    model = nnx.merge(graphdef, state)
    # Async scheduling: rows whose token the previous step sampled take it from that step's output, on the device.
    sources = batch.token_sources
    token_ids = jnp.where(sources >= 0, previous_tokens[jnp.maximum(sources, 0)], batch.token_ids)
    x, kv_cache = model.hidden_states(kv_cache, token_ids, batch.positions, batch.attention, attend=attend)
    logits = model.logits(x[batch.sample_indices], num_rows=batch.num_sampled_rows())
    targets = batch.prompt_logprob_targets
    vocab_size = logits.shape[-1]
    prompt_stats = jax.lax.cond(jnp.any(targets >= 0),
                                lambda h: prompt_logprob_stats(model.logits(h), targets),
                                lambda h: empty_prompt_logprob_stats(h.shape[0], vocab_size), x)
    return logits, kv_cache, prompt_stats


def _pad_rows(sampled: Int[Array, " num_rows"], size: int) -> Int[Array, " size"]:
    return jnp.zeros(size, jnp.int32).at[:sampled.shape[0]].set(sampled)


@dataclasses.dataclass
class ForwardedStep:
    """A step whose model is dispatched and whose sampler is not yet (ModelRunner.forward -> .sample)."""

    logits: Optional[jax.Array]
    """The sampling rows' logits, on the device; None when the step scheduled nothing."""
    sampling: list[Request]
    """The request of each sampling row, in row order (a speculative row's request once per row)."""
    row_drafts: Optional[list[list[int]]] = None
    """Speculative decoding: per sampling row, the proposals before it (its draw follows them), when some row of
    the step verifies proposals; else None."""
    prompt_logprobs: Optional[Callable[[], list[PromptLogprobEntry]]] = None
    """Pulls the step's prompt logprobs to the host, when some row computed them."""


MAX_PARALLEL_COMPILES = 4
"""Compiles run at once during warm-up, at most: each holds its own module and compiler state in host memory."""


class ModelRunner:
    """The device side of an engine step."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, eos_token_ids: Sequence[int] = (),
                 mesh: Optional[jax.sharding.Mesh] = None):
        """`mesh`: this rank's ("data", "model") mesh; None is a (1, 1) mesh on the first device. Makes the rank's
        start-up plan (startup.py), then carries it out: weights placed, KV pool allocated, step and sampler set up
        (compiled by warmup())."""
        compile_counter.install()
        self.mesh = mesh or mesh_lib.rank_meshes(1, 1)[0]
        # A model loaded without config.quantization is quantized here (one loaded with it, or a pre-quantized
        # checkpoint, already is).
        quantization = loaded.quantization or config.quantization
        params = quantize_params(dict(loaded.params), quantization)
        params, self.model_config = mesh_lib.replicate_kv_heads(params, loaded.config,
                                                                self.mesh.shape[mesh_lib.MODEL_AXIS])
        self.plan = plan_startup(self.model_config, params, config, self.mesh, quantization)
        """Every start-up decision of this rank (dtype, layers, packing, kernels, KV layout and size, memory)."""
        plan = self.plan
        self.dtype, self.backend, self.kv_layout = plan.dtype, plan.attention_backend, plan.kv_layout
        self.num_kv_blocks, self.memory_plan = plan.num_kv_blocks, plan.memory
        self.block_size = config.cache.block_size
        sched = config.scheduler
        self.max_model_len = plan.memory.max_model_len
        """config's max_model_len, or the model's context length the plan fitted to the pool when it was None."""
        self.inputs = StepInputBuilder(sched.max_num_batched_tokens, sched.max_num_seqs, self.max_model_len,
                                       self.block_size)
        """The host side of each step: the padded numpy batch (step_inputs.py)."""
        self.blocks_per_seq, self.ladder = self.inputs.blocks_per_seq, self.inputs.ladder
        self._replicated = mesh_lib.replicated(self.mesh)
        self._inputs_need_device_put = jax.process_count() > 1
        """The compiled step takes the packed numpy inputs as they are (its own transfer costs a fraction of
        jax.device_put's, ~20 against ~50 us); a mesh over several processes needs them put as a global array."""
        graphdef = self._place_weights(params)
        self.kv_pool = KVPool(plan.kv_spec, plan.num_kv_blocks, self.mesh)
        """The donated KV cache, its block copies and tier transfers."""
        self._build_step(graphdef, self.kv_pool.sharding)
        self._compiled: dict[Bucket, jax.stages.Compiled] = {}
        self._set_up_sampling(loaded.config.vocab_size, eos_token_ids, config)
        self.before_step: Optional[Callable[[Bucket, StepInputs], None]] = None
        """Called with each step's padded plan before it runs (multi-host: broadcasts it to the followers)."""
        self.warmup_seconds = 0.0
        self.last_prepare_seconds = 0.0
        """Host time of the last forward's prepare() (the engine's step timings read it)."""
        log_plan(plan)

    def _place_weights(self, params: dict[str, np.ndarray]) -> nnx.GraphDef:
        """The weights on the rank's devices, arranged and packed as planned; the model's graph definition."""
        plan = self.plan
        placed = mesh_lib.place_params(params, self.model_config, self.mesh, self.dtype, per_layer=plan.per_layer,
                                       pack=plan.packed_weights, pack_int8=plan.packed_int8)
        graphdef, state = nnx.split(LlamaForCausalLM(self.model_config, placed, packed=plan.packed_weights,
                                                     int8_matmul=plan.int8_matmul))
        # A plain dict of arrays: every step flattens it to call the executable, and nnx's Variables flatten in
        # Python, several times slower than the dict for a model's per-layer weights.
        self.state = nnx.to_pure_dict(state)
        return graphdef

    def _build_step(self, graphdef: nnx.GraphDef, kv_sharding: jax.sharding.Sharding) -> None:
        """The jitted step and block copy, with explicit shardings (the executables compiled at warm-up serve every
        call); the step's inputs travel as one int32 array, cut into StepInputs by the bucket's static PackedLayout."""
        attend = functools.partial(paged_attention, backend=self.backend, native_decode=self.plan.native_decode,
                                   kv_cache_dtype=self.plan.kv_cache_dtype, page_size=self.block_size)
        if self.plan.tensor_parallel_size > 1:
            attend = mesh_lib.shard_attention(attend, self.mesh)
        state_shardings = jax.tree.map(lambda x: x.sharding, self.state)
        replicated = self._replicated
        self._jitted = jax.jit(functools.partial(_forward, graphdef, attend), donate_argnums=(1,), static_argnums=(4,),
                               in_shardings=(state_shardings, kv_sharding, replicated, replicated),
                               out_shardings=(replicated, kv_sharding, replicated))

    def _set_up_sampling(self, vocab_size: int, eos_token_ids: Sequence[int], config: EngineConfig) -> None:
        """The token sampler, where it samples, and the state async scheduling feeds the next step from."""
        # Multi-host: the logits are replicated over the rank's devices, so process 0 holds a whole copy and
        # samples it on its own first device; no other process samples.
        local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        self._samples_locally = len(local) < self.mesh.devices.size
        placement = jax.sharding.SingleDeviceSharding(local[0]) if self._samples_locally else self._replicated
        self.sampler = TokenSampler(vocab_size, eos_token_ids, placement)
        self.async_scheduling = bool(config.async_scheduling)
        """Steps may be planned while the one before is in flight: decode rows then take their token from the
        previous step's sampled ids on the device (StepInputs.token_sources). LLMEngine resolves the option's None
        before building runners; a runner built on its own (a multi-host follower) reads None as off."""
        max_num_seqs = config.scheduler.max_num_seqs
        self._no_previous_tokens = jax.device_put(np.zeros(max_num_seqs, np.int32), self._replicated)
        self._pad_sampled = jax.jit(functools.partial(_pad_rows, size=max_num_seqs), out_shardings=self._replicated)
        self._previous_sampled: Optional[jax.Array] = None
        """The last launched step's sampled ids, on the device (async scheduling)."""

    @property
    def kv_cache(self) -> jax.Array:
        """The KV pool's array as it is now (every step donates it and replaces it)."""
        return self.kv_pool.cache

    @property
    def tier_transfer(self) -> Optional[TierTransfer]:
        """Moves blocks to and from the KV tiers below the device, when they are on (attach_kv_tiers)."""
        return self.kv_pool.tier_transfer

    @property
    def before_copy(self) -> Optional[Callable[[np.ndarray], None]]:
        """Called with each batch of block copies before it runs (multi-host: broadcasts it to the followers)."""
        return self.kv_pool.before_copy

    @before_copy.setter
    def before_copy(self, hook: Optional[Callable[[np.ndarray], None]]) -> None:
        self.kv_pool.before_copy = hook

    def tier_block_shape(self) -> tuple[int, ...]:
        """One block's shape as each tensor-parallel shard stores it below the device (for the tiers' fingerprint)."""
        return self.plan.kv_spec.tier_block_shape

    def attach_kv_tiers(self, tiers: KVTiers) -> None:
        """Offload evicted blocks to `tiers` and load lower-tier hits from them (compiles the two transfers)."""
        self.kv_pool.attach_tiers(tiers)

    def measure_load_and_prefill_seconds(self) -> tuple[float, float]:
        """(seconds to load one batch of tier blocks, seconds per prefill token of the largest bucket's step), both
        medians of a few runs on padding (which only writes the null block): what recomputing costs against
        loading. Call after warm-up."""
        load_seconds = self.kv_pool.measure_load_seconds()
        bucket = self.ladder.buckets()[-1]
        batch = self.inputs.empty(bucket)
        seconds = []
        for _ in range(3):
            start = time.perf_counter()
            jax.block_until_ready(self.compute_logits(bucket, batch))
            seconds.append(time.perf_counter() - start)
        return load_seconds, sorted(seconds)[1] / bucket.num_tokens

    # ---- compilation -------------------------------------------------------------------------------------------
    def warmup(self, sampler: bool = True, progress: Optional[bool] = None) -> float:
        """Compile every bucket's step (and every sampler variant, unless a follower that never samples) ahead
        of serving; returns the seconds it took. `progress`: a bar of programs compiled on stderr (None: when
        stderr is a terminal)."""
        start = time.perf_counter()
        buckets = self.ladder.buckets()
        tasks: list[Callable[[], object]] = [functools.partial(self._executable, bucket) for bucket in buckets]
        tasks.append(self.kv_pool.copy_executable)
        if sampler:
            tasks += self.sampler.warmup_tasks(bucket.num_seqs for bucket in buckets)
            if self.async_scheduling:  # a full row count needs no padding (_padded_previous_sampled)
                row_counts = {bucket.num_seqs for bucket in buckets} - {self.ladder.max_num_seqs}
                tasks += [functools.partial(self._compile_pad, num_rows) for num_rows in sorted(row_counts)]
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
        self.warmup_seconds = time.perf_counter() - start
        return self.warmup_seconds

    def _executable(self, bucket: Bucket):
        if bucket not in self._compiled:
            example = empty_step_inputs(bucket.num_tokens, bucket.num_seqs, self.blocks_per_seq)
            packed = jax.device_put(pack_step_inputs(example), self._replicated)
            self._compiled[bucket] = self._jitted.lower(self.state, self.kv_pool.cache, packed,
                                                        self._no_previous_tokens, PackedLayout.of(example)).compile()
        return self._compiled[bucket]

    def _compile_pad(self, num_rows: int) -> None:
        sampled = jax.device_put(np.zeros(num_rows, np.int32), self.sampler.placement)
        jax.block_until_ready(self._pad_sampled(sampled))

    # ---- one step --------------------------------------------------------------------------------------------
    def prepare(self, output: SchedulerOutput) -> tuple[Bucket, StepInputs]:
        """Pad the scheduled requests into their bucket as host numpy arrays (StepInputBuilder.build)."""
        return self.inputs.build(output)

    def execute(self, output: SchedulerOutput) -> StepResult:
        """Run the step and sample: one token per scheduled request that reached the end of its known tokens."""
        return self.launch(output).result()

    def launch(self, output: SchedulerOutput) -> PendingSample:
        """execute() without the wait: the step and the sampler are dispatched, their results stay on the device
        until PendingSample.result(). The engine launches every data-parallel rank before waiting on any."""
        return self.sample(self.forward(output))

    def forward(self, output: SchedulerOutput) -> ForwardedStep:
        """The first half of launch(): the model's step is dispatched, the sampler not yet. Async scheduling with
        a grammar or penalties samples later (sample()), once the step before has put its tokens on the host: the
        model runs meanwhile."""
        self.last_prepare_seconds = 0.0
        if not output.scheduled:
            return ForwardedStep(None, [])
        pool = self.kv_pool
        pending_saves = pool.start_tier_transfers(output.kv_saves, output.kv_loads)
        pool.apply_block_copies(output.block_copies)
        start = time.perf_counter()
        bucket, batch = self.prepare(output)
        self.last_prepare_seconds = time.perf_counter() - start
        if self.before_step is not None:
            self.before_step(bucket, batch)
        prompt_rows = self.inputs.prompt_rows
        previous_tokens = self._padded_previous_sampled() if self.inputs.feeds_previous else None
        logits, prompt_stats = self.run_step(bucket, batch, previous_tokens)  # row j: the j-th sampling request
        if self._samples_locally:
            logits = logits.addressable_data(0)
        pool.finish_tier_saves(pending_saves)  # host copies while the device runs the step
        prompt_logprobs = (lambda: host_entries(prompt_stats, prompt_rows)) if prompt_rows else None
        if not any(item.num_spec_tokens for item in output.scheduled):
            return ForwardedStep(logits, [item.request for item in output.scheduled if item.sample],
                                 prompt_logprobs=prompt_logprobs)
        sampling, row_drafts = [], []
        for item in output.scheduled:
            if item.sample:
                for num_drafted in range(1 + item.num_spec_tokens):
                    sampling.append(item.request)
                    row_drafts.append(item.token_ids[1:1 + num_drafted])
        return ForwardedStep(logits, sampling, row_drafts=row_drafts, prompt_logprobs=prompt_logprobs)

    def sample(self, step: ForwardedStep) -> PendingSample:
        """The second half of launch(): the sampler is dispatched on the step's logits, reading each request's
        state now (its grammar, output tokens and count)."""
        if step.logits is None:
            return PendingSample(None, 0, wants_logprobs=False)
        pending = self.sampler.launch(step.logits, step.sampling, step.row_drafts)
        if self.async_scheduling:
            self._previous_sampled = pending.device_token_ids
            self.inputs.remember_sampling_rows(step.sampling)
        pending.prompt_logprobs = step.prompt_logprobs
        return pending

    def copy_blocks(self, pairs: np.ndarray) -> None:
        """Apply one padded batch of (source, destination) block copies to the KV cache, in place."""
        self.kv_pool.copy_blocks(pairs)

    def compute_logits(self, bucket: Bucket, host_batch: StepInputs) -> jax.Array:
        """Run the compiled step of `bucket` on a prepared batch, updating the KV cache in place; the sampled
        rows' logits."""
        return self.run_step(bucket, host_batch)[0]

    def run_step(self, bucket: Bucket, host_batch: StepInputs,
                 previous_tokens: Optional[Int[Array, " max_num_seqs"]] = None,
                 ) -> tuple[jax.Array, PromptLogprobStats]:
        """compute_logits() plus the step's prompt-logprob stats (zeros unless a row has a target).
        `previous_tokens`: the ids host_batch.token_sources points into (async scheduling)."""
        packed = pack_step_inputs(host_batch)  # one array, one transfer
        if self._inputs_need_device_put:
            packed = jax.device_put(packed, self._replicated)
        if previous_tokens is None:
            previous_tokens = self._no_previous_tokens
        pool = self.kv_pool
        logits, pool.cache, prompt_stats = self._executable(bucket)(self.state, pool.cache, packed, previous_tokens)
        return logits, prompt_stats

    def _padded_previous_sampled(self) -> Int[Array, " max_num_seqs"]:
        sampled = self._previous_sampled
        assert sampled is not None, "a row takes its token from a step that sampled nothing"
        if sampled.shape[0] == self.ladder.max_num_seqs:
            return sampled
        return self._pad_sampled(sampled)


def build_rank_runners(loaded: LoadedModel, config: EngineConfig,
                       eos_token_ids: Sequence[int] = ()) -> list[ModelRunner]:
    """One runner per data-parallel rank, each over its (1, tp) mesh; ValueError when the layout cannot work."""
    tp, dp = config.tensor_parallel_size, config.data_parallel_size
    mesh_lib.check_parallel_layout(loaded.config, tp, dp, jax.device_count(), jax.process_count())
    return [ModelRunner(loaded, config, eos_token_ids, mesh) for mesh in mesh_lib.rank_meshes(tp, dp)]
