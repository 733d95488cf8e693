"""LLMEngine: requests in, RequestOutputs out, one step at a time.

A step is schedule -> execute -> update (the three phases below), driven by the synchronous or the overlapped
loop (loops.py). Optional features (KV tiers, multi-host, the prefix advisor) plug into the hooks of
features/base.py and are wired in features/wiring.py; this file does not import them.

Not thread-safe: the server's async engine owns it from a single loop thread.
"""

import dataclasses
import functools
import random
import time
from collections.abc import Iterable
from typing import Optional, Union

import jax

from jaxpaged.config import EngineConfig, kernel_options_from_environment
from jaxpaged.core.request import RequestStatus
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.engine.loops import OverlappedLoop, SynchronousLoop, resolve_async_scheduling
from jaxpaged.engine.output_processor import OutputProcessor
from jaxpaged.engine.rank_stats import collect_stats
from jaxpaged.engine.ranks import DataParallelRanks, LaunchedStep
from jaxpaged.engine.request_table import RequestTable
from jaxpaged.engine.requests import RequestGroup, make_samples
from jaxpaged.engine.stats import EngineStats
from jaxpaged.engine.step_timings import StepObserver, StepTimings
from jaxpaged.features.wiring import build_features
from jaxpaged.inputs import PromptInput, parse_prompt
from jaxpaged.kernels.attention_dispatch import check_kv_cache_dtype
from jaxpaged.lora.host_cache import LoRAAdapterCache
from jaxpaged.lora.peft_adapter import PeftAdapter
from jaxpaged.lora.request import LoRARequest
from jaxpaged.models.moe_decoder import runs_in_lock_step
from jaxpaged.outputs import RequestOutput
from jaxpaged.runner import LockStepRanks, ModelRunner, build_rank_runners
from jaxpaged.sampling.batch import penalizes_output_tokens
from jaxpaged.sampling.grammar import CompiledGrammar, GrammarCompiler
from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams
from jaxpaged.speculative import build_speculator
from jaxpaged.weights.generation_config import request_defaults
from jaxpaged.weights.loader import LoadedModel, load_model
from jaxpaged.weights.tokenizer_source import load_tokenizer


class LLMEngine:
    """Requests in, RequestOutputs out, one step at a time."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, *, warmup: bool = True):
        lock_step = runs_in_lock_step(loaded.config, config.enable_expert_parallel, config.data_parallel_size)
        config = dataclasses.replace(config, async_scheduling=resolve_async_scheduling(config, jax.default_backend()))
        self.config = config
        self.model_name = loaded.name
        self.model_config = loaded.config
        self.vocab_size = loaded.config.vocab_size
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.tokenizer = load_tokenizer(loaded.tokenizer_dir, config.tokenizer)
        self.sampling_defaults = request_defaults(loaded.generation_defaults)
        """Sampling fields from the model's generation_config.json, for requests that leave them unset."""
        self.eos_token_ids = list(loaded.config.eos_token_ids) or (
            [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else [])
        # Experts over dp x tp devices: the ranks share one program and step together (runner/lock_step.py).
        group = LockStepRanks(loaded, config, self.eos_token_ids) if lock_step else None
        runners: list[ModelRunner] = ([*group.ranks] if group is not None
                                      else build_rank_runners(loaded, config, self.eos_token_ids))
        # NOTE: max_model_len None (the model's context length) is settled by the start-up plan, which knows the pool.
        self.max_model_len = min(runner.max_model_len for runner in runners)
        config = self.config = dataclasses.replace(
            config, scheduler=dataclasses.replace(config.scheduler, max_model_len=self.max_model_len))
        self.features = build_features(loaded, config, runners, self.tokenizer)
        """The optional features this engine runs with, behind the loop's hooks."""
        self.lora_adapters: Optional[LoRAAdapterCache] = None
        """With enable_lora: the adapters requests may name, and the host LRU of them read (max_cpu_loras)."""
        if config.enable_lora:
            self.lora_adapters = LoRAAdapterCache(loaded.config, config.max_lora_rank,
                                                  config.max_cpu_loras or config.max_loras)
            for runner in runners:
                runner.lora_source = self.lora_adapters.get
        schedulers = [Scheduler(config.scheduler, config.cache, runner.num_kv_blocks, self.features.lower_tiers,
                                config.speculative.max_tokens_per_step, runner.plan.kv_spec.group_windows,
                                max_loras=config.max_loras if config.enable_lora else 0) for runner in runners]
        self.ranks = DataParallelRanks(schedulers, runners, config.cache.block_size, group)
        self.requests = RequestTable()
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        """Structured outputs: compiles each constrained request's grammar (off this thread; see submit())."""
        self.timings = StepTimings()
        """The host time of the last step, by phase (filled in place)."""
        self.processor = OutputProcessor(self.requests, self.tokenizer, self.timings)
        self.loop = OverlappedLoop(self) if config.async_scheduling else SynchronousLoop(self)
        self.speculator = build_speculator(config, loaded, self.tokenizer, self.max_model_len, str(self.runner.dtype))
        """Speculative decoding's proposer and policy, when speculative_method is set."""
        self.observers: list[StepObserver] = []
        """Watch every step (the bench's step probe); see step_timings.py."""
        self._seed_rng = random.Random(config.seed)
        self._prompt_tokens_total = 0
        self._num_steps = 0
        self.warmup_seconds = sum(runner.warmup() for runner in runners) if warmup else 0.0
        if warmup and self.speculator is not None:
            self.warmup_seconds += self.speculator.warmup()
        self.features.after_warmup(self.ranks)

    @classmethod
    def from_options(cls, model: Optional[str] = None, *, revision: Optional[str] = None,
                     **engine_options) -> "LLMEngine":
        """Load `model` (None: the embedded SmolLM2-135M-Instruct; `revision`: of a Hugging Face repo id) with flat
        engine options (the kernel fields also from JAXPAGED_CPU_MATMUL / JAXPAGED_CPU_ATTENTION when not given), and
        warm up."""
        config = EngineConfig.from_options(**{**kernel_options_from_environment(engine_options), **engine_options})
        # A KV format this platform's attention backend cannot read fails before any weight is read.
        check_kv_cache_dtype(config.cache.kv_cache_dtype, config.attention_backend)
        if config.compilation_cache_dir != "":
            enable_persistent_compilation_cache(config.compilation_cache_dir)
        return cls(load_model(model, revision=revision, quantization=config.quantization), config)

    @property
    def runner(self) -> ModelRunner:
        """Rank 0's model runner: the only one unless data_parallel_size > 1."""
        return self.ranks.runners[0]

    @property
    def scheduler(self) -> Scheduler:
        """Rank 0's scheduler: the only one unless data_parallel_size > 1."""
        return self.ranks.schedulers[0]

    # ---- requests --------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptInput, sampling_params: Optional[SamplingParams] = None,
                    *, arrival_time: Optional[float] = None, grammar: Optional[CompiledGrammar] = None,
                    lora_request: Optional[LoRARequest] = None) -> None:
        """Queue a request; ValueError naming the problem (and nothing changed) on bad input. `lora_request`: the
        LoRA adapter it runs with (read and checked now, the first time; enable_lora), None: the base model.

        `grammar`: its structured_outputs already compiled (self.grammars.submit(), as the async engine does, so the
        loop never waits for a compile); when None, a constrained request's grammar is compiled here, waited for."""
        params = sampling_params or self.default_sampling_params()
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        parsed = parse_prompt(prompt, self.tokenizer, self.vocab_size)
        params.validate_token_ids(self.vocab_size)
        num_prompt = len(parsed.token_ids)
        if num_prompt + params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) "
                             f"exceeds max_model_len ({self.max_model_len})")
        arrival_time = time.time() if arrival_time is None else arrival_time
        # A bad schema, regex or grammar is refused here, before anything is queued (never mid-stream).
        if grammar is None and params.structured_outputs is not None:
            grammar = self.grammars.compile(params.structured_outputs)
        adapter = self._read_lora(lora_request)
        samples = make_samples(request_id, parsed, params, arrival_time, self.tokenizer, self.eos_token_ids,
                               self._seed_rng, lora_request, None if adapter is None else adapter.fingerprint)
        if grammar is not None:
            starts_after = self._marker_ids(params.structured_outputs)
            for sample in samples:  # copies of one compiled matcher (cheap), never a rebuild per sample
                sample.request.grammar = self.grammars.new_request_grammar(grammar, starts_after)
        dp_rank = self.ranks.route(samples[0].request)
        self.ranks.schedulers[dp_rank].add_request(samples[0].request)  # validates against the pool before anything
        group = RequestGroup(request_id, parsed, params, samples, arrival_time)
        self.requests.add(group, dp_rank, needs_tokens_on_host=grammar is not None or penalizes_output_tokens(params))
        self.features.on_add(group, dp_rank, self.ranks)
        self._prompt_tokens_total += num_prompt * params.n

    def _marker_ids(self, structured: Optional[StructuredOutputsParams]) -> tuple[int, ...]:
        """The token ids a grammar starts after (StructuredOutputsParams.starts_after), as the model writes the
        marker: one special token for `</think>` in the thinking models' vocabularies."""
        if structured is None or structured.starts_after is None:
            return ()
        ids = tuple(self.tokenizer.encode(structured.starts_after, add_special_tokens=False))
        if not ids:
            raise ValueError(f"structured_outputs.starts_after: {structured.starts_after!r} encodes to no tokens")
        return ids

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the model's recommended settings (generation_config.json), as vLLM does."""
        return SamplingParams(**self.sampling_defaults)

    # ---- LoRA adapters (vLLM's add_lora / remove_lora / list_loras) ----

    def add_lora(self, lora_request: Optional[LoRARequest]) -> bool:
        """Read and check an adapter so requests may name it (add_request does it on first use); ValueError naming
        the adapter and the field when it is bad or LoRA is off. True when given one."""
        return self._read_lora(lora_request) is not None

    def _read_lora(self, lora_request: Optional[LoRARequest]) -> Optional[PeftAdapter]:
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request: expected a LoRARequest, got {type(lora_request).__name__}")
        if self.lora_adapters is None:
            raise ValueError(f"lora_request: LoRA adapter {lora_request.lora_name!r} given, but the engine runs "
                             "without enable_lora")
        return self.lora_adapters.add(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        """Stop serving an adapter (requests running with it finish with it); False when none has the id."""
        adapters = self.lora_adapters
        named = [] if adapters is None else [lora for lora in adapters.served() if lora.lora_int_id == lora_id]
        return bool(named) and adapters is not None and adapters.remove(named[0].lora_name) is not None

    def list_loras(self) -> list[int]:
        """The ids of the adapters requests may name (vLLM's list_loras)."""
        return [] if self.lora_adapters is None else [lora.lora_int_id for lora in self.lora_adapters.served()]

    def abort_request(self, request_ids: Union[str, Iterable[str]]) -> None:
        """Drop requests now and free their KV blocks; unknown ids are ignored."""
        for request_id in [request_ids] if isinstance(request_ids, str) else list(request_ids):
            dp_rank = self.requests.dp_rank_of.get(request_id)
            group = self.requests.forget(request_id)
            if group is None or dp_rank is None:
                continue
            sample_ids = [sample.request.request_id for sample in group.samples]
            self.ranks.schedulers[dp_rank].finish_requests(sample_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block on every data-parallel rank; False (nothing changed) while requests run."""
        if self.has_unfinished_requests():
            return False
        self.features.on_reset()
        reset = all([scheduler.reset_prefix_cache() for scheduler in self.ranks.schedulers])
        self.features.after_step(self.ranks)
        return reset

    def output_token_counts(self) -> dict[str, int]:
        """Tokens generated so far by each unfinished request (all its samples), without building its output."""
        return {request_id: group.num_output_tokens() for request_id, group in self.requests.groups.items()}

    # ---- the step --------------------------------------------------------------------------------------------
    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """Schedule, execute (the model and the sampler), update; returns the outputs of requests that progressed,
        or with `final_only` of those that finished (vLLM's FINAL_ONLY output kind: offline callers skip building a
        cumulative output per running request per step)."""
        self.timings.reset()
        start = time.perf_counter()
        with self.features.step_guard():
            outputs, self.timings.hidden = self.loop.step(final_only)
        self.features.after_step(self.ranks)
        self._num_steps += 1
        self.timings.step_s = time.perf_counter() - start
        for observer in self.observers:
            observer.after_step(outputs, self.timings)
        return outputs

    def release_held_back(self) -> None:
        """Before a step: the later samples of n > 1 requests whose first sample has computed the prompt join their
        scheduler (they find its blocks in the prefix cache)."""
        for dp_rank, sample in self.requests.release_held_back():
            self.ranks.schedulers[dp_rank].add_request(sample.request)

    def dp_ranks(self) -> range:
        """The data-parallel ranks, in the order every step visits them."""
        return range(len(self.ranks))

    def schedule(self, dp_rank: int) -> SchedulerOutput:
        """Phase 1: a rank's scheduler plans its step."""
        scheduler = self.ranks.schedulers[dp_rank]
        start = time.perf_counter()
        plan = scheduler.schedule()
        self.timings.schedule_s += time.perf_counter() - start
        self._note_first_scheduled(plan)
        for observer in self.observers:
            observer.after_schedule(scheduler)
        return plan

    def _note_first_scheduled(self, plan: SchedulerOutput) -> None:
        """Stamps when each request's group was first scheduled (its queue time ends there). Only rows without an
        output token yet are looked up: a step's decode rows cost nothing here."""
        now = None
        for scheduled in plan.scheduled:
            if scheduled.request.num_output_tokens:
                continue
            owner = self.requests.samples.get(scheduled.request.request_id)
            if owner is not None and owner[0].metrics.first_scheduled_time is None:
                now = now or time.time()
                owner[0].metrics.first_scheduled_time = now

    def execute(self, dp_rank: int, plan: SchedulerOutput, defer_sampling: bool = False) -> LaunchedStep:
        """Phase 2: a rank's step (model + sampler) is dispatched to its devices; its result is not awaited, so the
        next rank's step can run on its own devices at the same time. `defer_sampling`: only the model is
        dispatched; the sampler waits for sample_deferred()."""
        runner = self.ranks.runners[dp_rank]
        start = time.perf_counter()
        # NOTE: not isolated per request, unlike each row's host work: request_failures.py says why.
        forwarded = runner.forward(plan)
        self.timings.launch_s += time.perf_counter() - start - runner.last_prepare_seconds
        self.timings.prepare_s += runner.last_prepare_seconds
        step = LaunchedStep(dp_rank, plan, None, forwarded)
        if not defer_sampling:
            self.sample_deferred(step)
        return step

    def in_lock_step(self) -> bool:
        """The ranks step together, as one program (runner/lock_step.py): every rank plans, then one execute."""
        return self.ranks.lock_step is not None

    def execute_together(self, plans: list[SchedulerOutput], defer_sampling: bool = False) -> list[LaunchedStep]:
        """Phase 2 for ranks in lock step: every rank's plan (plans[r]) dispatched as one step; each rank's sampler
        then (unless `defer_sampling`), as execute() does for one rank."""
        group = self.ranks.lock_step
        assert group is not None
        start = time.perf_counter()
        forwarded = group.forward(plans)
        self.timings.launch_s += time.perf_counter() - start - group.last_prepare_seconds
        self.timings.prepare_s += group.last_prepare_seconds
        steps = [LaunchedStep(dp_rank, plan, None, step) for dp_rank, (plan, step) in enumerate(zip(plans, forwarded))]
        if not defer_sampling:
            for step in steps:
                self.sample_deferred(step)
        return steps

    def sample_deferred(self, step: LaunchedStep) -> None:
        """Dispatch the sampler of a step executed with defer_sampling, reading its requests' state now."""
        assert step.forwarded is not None and step.pending is None
        start = time.perf_counter()
        step.pending = self.ranks.runners[step.dp_rank].sample(step.forwarded)
        step.forwarded = None
        self.timings.launch_s += time.perf_counter() - start
        self.features.after_launch(step.pending)

    def update(self, launched: list[LaunchedStep], final_only: bool = False,
               sample_next: Optional[list[LaunchedStep]] = None) -> list[RequestOutput]:
        """Phase 3: each rank's sampled tokens (awaited now) are applied: scheduler state, stops, text, logprobs;
        the RequestOutputs (with `final_only`, of finished requests only). `sample_next`: steps planned ahead
        with their sampling deferred: each rank's is dispatched as soon as this step's tokens are in its
        requests (scheduler and grammars), before the text and outputs are made."""
        deferred = {step.dp_rank: step for step in sample_next or ()}
        outputs = []
        for step in launched:
            start = time.perf_counter()
            pending = step.sampled()
            pending.wait()
            ready = time.perf_counter()
            result = pending.result()
            self.timings.device_wait_s += ready - start
            start = time.perf_counter()
            self.timings.readback_s += start - ready
            next_step = deferred.get(step.dp_rank)
            then = None if next_step is None else functools.partial(self.sample_deferred, next_step)
            launch_before = self.timings.launch_s
            scheduler = self.ranks.schedulers[step.dp_rank]
            outputs += self.processor.update(scheduler, step.output, result, final_only, then)
            if self.speculator is not None:
                self.speculator.after_update(scheduler)
            deferred_launch = self.timings.launch_s - launch_before  # booked as launch time, not processing
            self.timings.process_s += time.perf_counter() - start - deferred_launch
        for step in deferred.values():  # a rank with nothing to apply this time
            if step.pending is None:
                self.sample_deferred(step)
        return outputs

    def may_plan_ahead(self) -> bool:
        """The overlapped loop may plan the next step before this one's tokens are on the host: something is left
        to run, and speculative decoding (if on) proposes for nobody at this batch size."""
        if self.speculator is not None and any(self.speculator.proposes_at(scheduler)
                                               for scheduler in self.ranks.schedulers):
            return False
        return self.ranks.has_unfinished_requests()

    def sampling_needs_last_tokens(self) -> bool:
        """Some request's next token depends on its last one on the host (a grammar, output penalties): a step
        planned ahead dispatches its model at once and its sampler once the step before has applied its tokens."""
        return bool(self.requests.needs_tokens_on_host)

    # ---- life cycle and stats --------------------------------------------------------------------------------
    def heartbeat(self) -> None:
        """Called while idle (multi-host: checks the followers are alive every so often)."""
        self.features.on_idle()

    def close(self, deadline: Optional[float] = None) -> None:
        """Persists the KV cache to the disk tier (when one is on) and, multi-host, tells the followers to exit.
        Call once no step will run again. `deadline` (time.monotonic()): the persist stops there, logging how many
        blocks it wrote and how many it did not."""
        self.features.close(self.ranks, deadline)
        self.grammars.close()

    def get_stats(self) -> EngineStats:
        """Gauges and cumulative counters."""
        stats = collect_stats(self.ranks.schedulers, prompt_tokens_total=self._prompt_tokens_total,
                              generation_tokens_total=self.processor.num_generated_tokens, num_steps=self._num_steps,
                              warmup_seconds=self.warmup_seconds,
                              max_loras=self.config.max_loras if self.lora_adapters is not None else None)
        self.features.add_stats(stats, self.ranks)
        return stats


def enable_persistent_compilation_cache(directory: Optional[str]) -> None:
    """JAX's on-disk executable cache, so a restart loads instead of compiling."""
    from jaxpaged.weights.loader import cache_root

    path = directory or str(cache_root() / "xla")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
