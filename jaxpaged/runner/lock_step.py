"""Data-parallel ranks in lock step: a mixture of experts whose experts span dp x tp devices
(enable_expert_parallel with data_parallel_size > 1, vLLM's placement).

Every other layout runs each rank as an engine replica on its own (1, tp) mesh (engine/ranks.py). Here a rank's
MoE layers need the experts on the other ranks' devices, so the ranks run ONE compiled program over one (dp, tp)
mesh, JAX's way of putting devices in lock step: each rank's scheduler still plans its own batch, the batches are
padded to the largest rank's bucket (an idle rank's rows are all padding: vLLM's dummy batch) and stacked on the
data axis (lock_step_step.py), the KV pool keeps a rank axis on the data axis (kv_pool.py), attention runs per
(rank, model shard) and the experts gather every rank's tokens (models/moe.py run_over_ranks).

LockStepRanks owns the shared device side (weights, pool, compiled step, sampler); each rank is a LockStepRank, the
ModelRunner the engine and its features see for that rank (plan, schedulers' sizes, sampling), whose forward is
the group's: the engine steps them together (LLMEngine.execute_together).

Async scheduling runs as for independent ranks: a rank's rows in flight take their tokens from its own previous
sampled ids, which the step receives stacked per rank. What this mode does not run, refused by name at start-up
(check_lock_step_options): LoRA, speculative decoding, the KV tiers and several hosts. The plan uses XLA's dot for
every projection (cpu_matmul "xla"): the native CPU matmuls skip rows past the model's num_rows, which counts one
rank's rows, not the joined batch's.
"""

import dataclasses
import time
from collections.abc import Sequence
from typing import Optional

import jax

from jaxpaged.config import EngineConfig
from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.models.int8_weights import quantize_params
from jaxpaged.models.moe_decoder import with_expert_parallel
from jaxpaged.runner import compile_counter
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.compiled_step import compile_all, place_model
from jaxpaged.runner.expert_lanes import pad_experts_to_lanes
from jaxpaged.runner.kv_pool import KVPool
from jaxpaged.runner.lock_step_step import LockStepCompiledStep, shift_prompt_rows
from jaxpaged.runner.model_runner import ForwardedStep, ModelRunner
from jaxpaged.runner.startup import log_plan, plan_startup
from jaxpaged.runner.step_inputs import StepInputBuilder
from jaxpaged.sampling.prompt_logprobs import host_entries
from jaxpaged.sampling.token_sampler import PendingSample, TokenSampler
from jaxpaged.weights.loader import LoadedModel


def check_lock_step_options(config: EngineConfig) -> None:
    """ValueError naming the option that ranks in lock step do not run (the module docstring)."""
    layout = (f"with enable_expert_parallel over data_parallel_size ({config.data_parallel_size}) x "
              f"tensor_parallel_size ({config.tensor_parallel_size}): the ranks step in lock step")
    refused = {"enable_lora": config.enable_lora,
               "speculative_method": config.speculative.enabled,
               "kv_offload": config.cache.kv_offload_enabled}
    for option, on in refused.items():
        if on:
            raise ValueError(f"{option}: not supported {layout}")
    if jax.process_count() > 1:
        raise ValueError(f"data_parallel_size: several hosts are not supported {layout}")


class LockStepRanks:
    """The device side every rank in lock step shares: weights over the (dp, tp) mesh, one pool with a rank axis,
    one compiled step per bucket and the sampler; `ranks` are the per-rank runners the engine holds."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, eos_token_ids: Sequence[int] = ()):
        compile_counter.install()
        check_lock_step_options(config)
        tp, num_ranks = config.tensor_parallel_size, config.data_parallel_size
        mesh_lib.check_parallel_layout(with_expert_parallel(loaded.config, True, num_ranks), tp, num_ranks,
                                       jax.device_count(), jax.process_count())
        self.mesh = mesh_lib.lock_step_mesh(tp, num_ranks)
        config = dataclasses.replace(config, cpu_matmul="xla")  # the module docstring says why
        quantization = loaded.quantization or config.quantization
        params = quantize_params(dict(loaded.params), quantization)
        params, model_config = mesh_lib.replicate_kv_heads(params, loaded.config, tp)
        self.model_config = with_expert_parallel(model_config, True, num_ranks)
        if self.mesh.devices.flat[0].platform == "tpu":  # the grouped matmul's weights in whole lanes (a view)
            params = pad_experts_to_lanes(params, self.model_config, tp)
        self.plan = plan_startup(self.model_config, params, config, self.mesh, quantization)
        """Every rank's start-up plan: the same devices, weights and pool size per rank."""
        sched = config.scheduler
        self.inputs = [StepInputBuilder(sched.max_num_batched_tokens, sched.max_num_seqs,
                                        self.plan.memory.max_model_len, config.cache.block_size,
                                        self.plan.kv_spec.num_groups) for _ in range(num_ranks)]
        """Each rank's host side: its padded batch and block table."""
        graphdef, state = place_model(params, self.model_config, self.plan, self.mesh)
        self.kv_pool = KVPool(self.plan.kv_spec, self.plan.num_kv_blocks, self.mesh)
        self.step = LockStepCompiledStep(graphdef, state, self.plan, self.mesh, self.kv_pool, self.inputs[0])
        self.sampler = TokenSampler(loaded.config.vocab_size, eos_token_ids, mesh_lib.replicated(self.mesh))
        """Samples each rank's rows in turn (it holds no state of a rank's)."""
        self.async_scheduling = bool(config.async_scheduling)
        """Steps are planned while the one before is in flight (LLMEngine resolves the option's None first)."""
        self.last_prepare_seconds = 0.0
        self.warmup_seconds: Optional[float] = None
        """Set by the first warmup(); every rank's warmup() is that one."""
        self.ranks = [LockStepRank(self, rank) for rank in range(num_ranks)]
        log_plan(self.plan)

    def warmup(self, progress: Optional[bool] = None) -> float:
        """Compile every bucket's step, the block copy and the sampler's variants once; seconds it took (0 after
        the first call: the ranks share them)."""
        if self.warmup_seconds is not None:
            return 0.0
        start = time.perf_counter()
        ladder = self.inputs[0].ladder
        tasks = [*self.step.warmup_tasks(), self.kv_pool.copy_executable,
                 *self.sampler.warmup_tasks(bucket.num_seqs for bucket in ladder.buckets())]
        if self.async_scheduling:
            tasks += self.step.pad_tasks(self.sampler.placement)
        compile_all(tasks, progress)
        self.warmup_seconds = time.perf_counter() - start
        return self.warmup_seconds

    def forward(self, outputs: Sequence[SchedulerOutput]) -> list[ForwardedStep]:
        """Dispatch one step of every rank (outputs[r]: rank r's plan), block copies first; a ForwardedStep per rank
        (an idle rank's has no logits: its rows were all padding)."""
        self.last_prepare_seconds = 0.0
        if any(output.kv_saves or output.kv_loads for output in outputs):
            raise AssertionError("the KV tiers are refused for ranks in lock step")
        self.kv_pool.apply_rank_block_copies([output.block_copies for output in outputs])
        if not any(output.scheduled for output in outputs):
            return [ForwardedStep(None, []) for _ in outputs]
        start = time.perf_counter()
        ladder = self.inputs[0].ladder
        bucket = ladder.pick(max(output.num_scheduled_tokens for output in outputs),
                             max(len(output.scheduled) for output in outputs))
        batches = [inputs.build(output, bucket=bucket)[1] for inputs, output in zip(self.inputs, outputs)]
        self.last_prepare_seconds = time.perf_counter() - start
        logits, prompt_stats = self.step.run(bucket, batches, [inputs.feeds_previous for inputs in self.inputs])
        steps = []
        for rank, (output, rank_logits) in enumerate(zip(outputs, logits)):
            if not output.scheduled:
                steps.append(ForwardedStep(None, []))
                continue
            rows = shift_prompt_rows(self.inputs[rank].prompt_rows, rank, bucket.num_tokens)
            sampling, row_drafts = ModelRunner._sampling_rows(output)
            steps.append(ForwardedStep(rank_logits, sampling, row_drafts=row_drafts,
                                       prompt_logprobs=(lambda rows=rows: host_entries(prompt_stats, rows))
                                       if rows else None))
        return steps


class LockStepRank(ModelRunner):
    """One rank in lock step, as the engine sees a rank's runner: its plan, sizes, input builder and sampling are
    ModelRunner's; its device side is the group's, and its steps go through LockStepRanks.forward.

    NOTE: ModelRunner.__init__ is not called: it would place a model of the rank's own; every attribute the
    inherited methods read is set here."""

    def __init__(self, group: LockStepRanks, rank: int) -> None:  # pyright: ignore[reportMissingSuperCall]
        self.group = group
        """The ranks this one steps with."""
        self.rank = rank
        self.mesh = group.mesh
        self.model_config = group.model_config
        self.plan = group.plan
        self.inputs = group.inputs[rank]
        self.lora = None
        self.lora_source = None
        self.kv_pool = group.kv_pool
        self.step = group.step  # pyright: ignore[reportAttributeAccessIssue]
        self.sampler = group.sampler
        self._samples_locally = False
        self.async_scheduling = group.async_scheduling
        self.before_step = None
        self.warmup_seconds = 0.0
        self.last_prepare_seconds = 0.0

    def warmup(self, sampler: bool = True, progress: Optional[bool] = None) -> float:
        """The group's warm-up, run by the first rank that asks (the others' take no time)."""
        self.warmup_seconds = self.group.warmup(progress)
        return self.warmup_seconds

    def remember_sampled(self, pending: PendingSample, sampling: list[Request]) -> None:
        """Async scheduling: this rank's rows in flight take their tokens from these ids (its row of the step's
        previous tokens)."""
        self.group.step.previous_sampled[self.rank] = pending.device_token_ids
        self.inputs.remember_sampling_rows(sampling)

    def forward(self, output: SchedulerOutput) -> ForwardedStep:
        """Ranks in lock step have no step of their own: LockStepRanks.forward steps them all."""
        raise RuntimeError("a rank in lock step is stepped with every rank: LockStepRanks.forward")
