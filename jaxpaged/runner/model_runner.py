"""ModelRunner: the device side of an engine step, as two calls: forward() (SchedulerOutput -> tier transfers and
block copies -> padded numpy batch -> the compiled step) and sample() (the step's logits -> sampled ids).

It is a facade over three rooms, one per concern: the KV pool (kv_pool.py: the donated cache, block copies, tier
transfers), the step inputs (step_inputs.py: host numpy only) and the compiled step (compiled_step.py: the model's
jitted forward and its executables, compiled at warm-up; serving then only looks them up).
"""

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Optional

import jax
import numpy as np
from jaxtyping import Array, Int

from jaxpaged.config import EngineConfig
from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.kv_tiers import KVTiers
from jaxpaged.lora.peft_adapter import PeftAdapter
from jaxpaged.lora.slots import LoRASlots
from jaxpaged.models.int8_weights import quantize_params
from jaxpaged.models.moe_decoder import with_expert_parallel
from jaxpaged.runner import compile_counter
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.batch import StepInputs
from jaxpaged.runner.buckets import Bucket, BucketLadder
from jaxpaged.runner.compiled_step import CompiledStep, compile_all, place_model
from jaxpaged.runner.expert_lanes import pad_experts_to_lanes
from jaxpaged.runner.kv_pool import KVPool
from jaxpaged.runner.memory_plan import MemoryPlan
from jaxpaged.runner.process_agreement import check_processes_agree
from jaxpaged.runner.startup import log_plan, plan_startup
from jaxpaged.runner.step_inputs import StepInputBuilder
from jaxpaged.runner.tier_transfer import TierTransfer
from jaxpaged.sampling.prompt_logprobs import PromptLogprobEntry, PromptLogprobStats, host_entries
from jaxpaged.sampling.token_sampler import PendingSample, TokenSampler
from jaxpaged.weights.loader import LoadedModel


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
        params, model_config = mesh_lib.replicate_kv_heads(params, loaded.config,
                                                           self.mesh.shape[mesh_lib.MODEL_AXIS])
        self.model_config = with_expert_parallel(model_config, config.enable_expert_parallel)
        if self.mesh.devices.flat[0].platform == "tpu":  # the grouped matmul's weights in whole lanes (a view)
            params = pad_experts_to_lanes(params, self.model_config, self.mesh.shape[mesh_lib.MODEL_AXIS])
        self.plan = plan_startup(self.model_config, params, config, self.mesh, quantization)
        """Every start-up decision of this rank (dtype, layers, packing, kernels, KV spec and size, memory)."""
        sched = config.scheduler
        # max_model_len: config's, or the model's context length the plan fitted to the pool when it was None.
        self.inputs = StepInputBuilder(sched.max_num_batched_tokens, sched.max_num_seqs, self.plan.memory.max_model_len,
                                       config.cache.block_size, self.plan.kv_spec.num_groups)
        """The host side of each step: the padded numpy batch."""
        self.lora: Optional[LoRASlots] = None
        """The LoRA adapter slots, with enable_lora."""
        if config.enable_lora:
            self.lora = LoRASlots(self.model_config, config.max_loras, config.max_lora_rank, self.plan.dtype,
                                  self.mesh, self.plan.per_layer,
                                  kv_head_repeats=self.model_config.num_kv_heads // loaded.config.num_kv_heads)
        self.lora_source: Optional[Callable[[int], PeftAdapter]] = None
        """Gives an adapter by id when a step needs it in a slot (the engine's LoRAAdapterCache.get)."""
        graphdef, state = place_model(params, self.model_config, self.plan, self.mesh, self.lora)
        self.kv_pool = KVPool(self.plan.kv_spec, self.plan.num_kv_blocks, self.mesh)
        """The donated KV cache, its block copies and tier transfers."""
        self.step = CompiledStep(graphdef, state, self.plan, self.mesh, self.kv_pool, self.inputs)
        """The model's jitted step and its executables."""
        self._set_up_sampling(loaded.config.vocab_size, eos_token_ids, config)
        self.before_step: Optional[Callable[[Bucket, StepInputs], None]] = None
        """Called with each step's padded plan before it runs (multi-host: broadcasts it to the followers)."""
        self.warmup_seconds = 0.0
        self.last_prepare_seconds = 0.0
        """Host time of the last forward's prepare() (the engine's step timings read it)."""
        log_plan(self.plan)

    def _set_up_sampling(self, vocab_size: int, eos_token_ids: Sequence[int], config: EngineConfig) -> None:
        """The token sampler and where it samples."""
        # Multi-host: the logits are replicated over the rank's devices, so process 0 holds a whole copy and
        # samples it on its own first device; no other process samples.
        local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
        self._samples_locally = len(local) < self.mesh.devices.size
        placement = (jax.sharding.SingleDeviceSharding(local[0]) if self._samples_locally
                     else mesh_lib.replicated(self.mesh))
        self.sampler = TokenSampler(vocab_size, eos_token_ids, placement)
        self.async_scheduling = bool(config.async_scheduling)
        """Steps may be planned while the one before is in flight: decode rows then take their token from the
        previous step's sampled ids on the device (StepInputs.token_sources). LLMEngine resolves the option's None
        before building runners; a runner built on its own (a multi-host follower) reads None as off."""

    # ---- views of the start-up plan and the rooms (the engine, features and tests read them) ----

    @property
    def dtype(self) -> np.dtype:
        """Weights and activations."""
        return self.plan.dtype

    @property
    def backend(self) -> str:
        """The attention backend."""
        return self.plan.attention_backend

    @property
    def kv_layout(self) -> str:
        """The KV pool's layout."""
        return self.plan.kv_layout

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return self.plan.num_kv_blocks

    @property
    def memory_plan(self) -> MemoryPlan:
        """Weights and KV per device."""
        return self.plan.memory

    @property
    def max_model_len(self) -> int:
        """config's max_model_len, or the model's context length the plan fitted to the pool when it was None."""
        return self.plan.memory.max_model_len

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self.plan.kv_spec.block_size

    @property
    def blocks_per_seq(self) -> int:
        """Block-table columns of a step."""
        return self.inputs.blocks_per_seq

    @property
    def ladder(self) -> BucketLadder:
        """The step's padded shapes."""
        return self.inputs.ladder

    @property
    def state(self) -> dict:
        """The placed weights."""
        return self.step.state

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

    # ---- start-up ----

    def attach_kv_tiers(self, tiers: KVTiers) -> None:
        """Offload evicted blocks to `tiers` and load lower-tier hits from them (compiles the two transfers)."""
        self.kv_pool.attach_tiers(tiers)

    def warmup(self, sampler: bool = True, progress: Optional[bool] = None) -> float:
        """Compile every bucket's step and the block copy (and every sampler variant, unless a follower that never
        samples) ahead of serving; returns the seconds it took. `progress`: a bar of programs compiled on stderr
        (None: when stderr is a terminal)."""
        start = time.perf_counter()
        tasks = [*self.step.warmup_tasks(), self.kv_pool.copy_executable]
        if sampler:
            tasks += self.sampler.warmup_tasks(bucket.num_seqs for bucket in self.ladder.buckets())
            if self.async_scheduling:
                tasks += self.step.pad_tasks(self.sampler.placement)
        compile_all(tasks, progress)
        self.warmup_seconds = time.perf_counter() - start
        return self.warmup_seconds

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

    # ---- one step ----

    def prepare(self, output: SchedulerOutput) -> tuple[Bucket, StepInputs]:
        """Pad the scheduled requests into their bucket as host numpy arrays (StepInputBuilder.build), loading the
        adapters of the step's LoRA rows into device slots first."""
        lora = self.lora
        if lora is None or not any(item.request.lora_id for item in output.scheduled):
            return self.inputs.build(output)
        assert self.lora_source is not None, "the engine sets lora_source with enable_lora"
        slots, wrote = lora.assign([item.request.lora_id for item in output.scheduled], self.lora_source)
        if wrote:
            self.step.replace_lora_slots(lora)
        return self.inputs.build(output, slots)

    def forward(self, output: SchedulerOutput) -> ForwardedStep:
        """Dispatch the model's step (tier transfers and block copies first), not the sampler. Async scheduling with
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
        previous_tokens = self.step.previous_tokens() if self.inputs.feeds_previous else None
        logits, prompt_stats = self.run_step(bucket, batch, previous_tokens)  # row j: the j-th sampling request
        if self._samples_locally:
            logits = logits.addressable_data(0)
        pool.finish_tier_saves(pending_saves)  # host copies while the device runs the step
        prompt_logprobs = (lambda: host_entries(prompt_stats, prompt_rows)) if prompt_rows else None
        sampling, row_drafts = self._sampling_rows(output)
        return ForwardedStep(logits, sampling, row_drafts=row_drafts, prompt_logprobs=prompt_logprobs)

    @staticmethod
    def _sampling_rows(output: SchedulerOutput) -> tuple[list[Request], Optional[list[list[int]]]]:
        """The request of each sampling row, and the proposals before each row when some row verifies some."""
        if not any(item.num_spec_tokens for item in output.scheduled):
            return [item.request for item in output.scheduled if item.sample], None
        sampling, row_drafts = [], []
        for item in output.scheduled:
            if item.sample:
                for num_drafted in range(1 + item.num_spec_tokens):
                    sampling.append(item.request)
                    row_drafts.append(item.token_ids[1:1 + num_drafted])
        return sampling, row_drafts

    def sample(self, step: ForwardedStep) -> PendingSample:
        """Dispatch the sampler on a forwarded step's logits, reading each request's state now (its grammar, output
        tokens and count); the result stays on the device until PendingSample.result()."""
        if step.logits is None:
            return PendingSample(None, 0, wants_logprobs=False)
        pending = self.sampler.launch(step.logits, step.sampling, step.row_drafts)
        if self.async_scheduling:
            self.remember_sampled(pending, step.sampling)
        pending.prompt_logprobs = step.prompt_logprobs
        return pending

    def remember_sampled(self, pending: PendingSample, sampling: list[Request]) -> None:
        """Async scheduling: the next step's rows in flight take their tokens from these sampled ids, on the
        device."""
        self.step.previous_sampled = pending.device_token_ids
        self.inputs.remember_sampling_rows(sampling)

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
        """compute_logits() plus the step's prompt-logprob stats (CompiledStep.run)."""
        return self.step.run(bucket, host_batch, previous_tokens)


def build_rank_runners(loaded: LoadedModel, config: EngineConfig,
                       eos_token_ids: Sequence[int] = ()) -> list[ModelRunner]:
    """One runner per data-parallel rank, each over its (1, tp) mesh; ValueError when the layout cannot work."""
    tp, dp = config.tensor_parallel_size, config.data_parallel_size
    model = with_expert_parallel(loaded.config, config.enable_expert_parallel)
    mesh_lib.check_parallel_layout(model, tp, dp, jax.device_count(), jax.process_count())
    runners = [ModelRunner(loaded, config, eos_token_ids, mesh) for mesh in mesh_lib.rank_meshes(tp, dp)]
    check_processes_agree(runners[0].inputs, runners[0].kv_pool.cache.shape)  # multi-host: before any step's collective
    return runners
