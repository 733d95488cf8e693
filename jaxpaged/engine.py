"""LLMEngine: the synchronous engine. One step is three calls: schedule, run the model, update.

Not thread-safe: the server's async engine owns it from a single loop thread.
"""

import contextlib
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Iterable
from typing import Optional, Union

import jax
from transformers import PreTrainedTokenizerFast

from jaxpaged.config import EngineConfig
from jaxpaged.core.prefix_advisor import PrefixAdvisor
from jaxpaged.core.request import Request, RequestStatus
from jaxpaged.core.router import PrefixAwareRouter
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.detokenizer import IncrementalDetokenizer
from jaxpaged.engine_kv_tiers import build_kv_tiers, choose_min_load_blocks, persist_kv_cache, tier_stats
from jaxpaged.engine_stats import EngineStats
from jaxpaged.inputs import PromptInput, parse_prompt
from jaxpaged.multihost.leader import FollowerLink
from jaxpaged.multihost.runtime import DEFAULT_TIMEOUT_S, is_multi_process
from jaxpaged.outputs import RequestOutput
from jaxpaged.request_group import RequestGroup, Sample
from jaxpaged.runner import compile_counter
from jaxpaged.runner.model_runner import build_rank_runners
from jaxpaged.runner.sampling_batch import penalizes_output_tokens
from jaxpaged.runner.step_result import StepResult
from jaxpaged.runner.token_sampler import PendingSample
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.structured_output import GrammarCompiler
from jaxpaged.weights.generation_config import request_defaults
from jaxpaged.weights.loader import LoadedModel, load_model

logger = logging.getLogger(__name__)


def resolve_async_scheduling(config: EngineConfig, platform: str) -> bool:
    """config.async_scheduling as a bool for devices of `platform`. None is on unless the KV tiers or multi-host
    serving are on (whose transfers and follower broadcasts expect each step's tokens on the host before the next
    is planned). On the CPU too: there the "device" is the host's own cores, so the host work planned ahead shares
    them with XLA's threads, yet W1 in float32 still gained (async / synchronous output tok/s 1.04 and 1.09 in
    both sweep orders on an AVX2 EPYC, 1.06 on a Zen 4 EPYC; one run on a Zen 5 EPYC gave 0.96). True with the
    tiers or multi-host is a ValueError. `platform` names the devices in the log line."""
    unsupported = config.cache.kv_offload_enabled or is_multi_process()
    if config.async_scheduling is None:
        if unsupported:
            logger.info("async scheduling off on %s: not supported with the KV tiers or multi-host serving",
                        platform)
        return not unsupported
    if config.async_scheduling and unsupported:
        raise ValueError("async_scheduling: not supported with the KV tiers (kv_offload_*) or multi-host serving; "
                         "turn one of them off")
    return config.async_scheduling


class LLMEngine:
    """Requests in, RequestOutputs out, one step at a time."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, *, warmup: bool = True,
                 distributed_timeout_s: float = DEFAULT_TIMEOUT_S):
        """`distributed_timeout_s`: multi-host only, the longest wait for a follower process (multihost/)."""
        config = dataclasses.replace(config, async_scheduling=resolve_async_scheduling(config, jax.default_backend()))
        self.config = config
        self.model_name = loaded.name
        self.model_config = loaded.config
        self.vocab_size = loaded.config.vocab_size
        sched = config.scheduler
        self.max_model_len = sched.max_model_len
        self.max_num_seqs = sched.max_num_seqs
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(loaded.tokenizer_dir))
        self.sampling_defaults = request_defaults(loaded.generation_defaults)
        """Sampling fields from the model's generation_config.json, for requests that leave them unset."""
        self.eos_token_ids = list(loaded.config.eos_token_ids) or (
            [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else [])
        # Data parallel: one runner (device group, page pool) and one scheduler per rank; tp splits each runner.
        self.runners = build_rank_runners(loaded, config, self.eos_token_ids)
        self.kv_tiers = build_kv_tiers(loaded, config, self.runners) if config.cache.kv_offload_enabled else None
        """Host and disk KV tiers below the device pools (shared by the data-parallel ranks), if on."""
        self.schedulers = [Scheduler(sched, config.cache, runner.num_kv_blocks, self.kv_tiers)
                           for runner in self.runners]
        self.runner, self.scheduler = self.runners[0], self.schedulers[0]
        """Rank 0's runner and scheduler: the only ones unless data_parallel_size > 1."""
        self._router = PrefixAwareRouter(config.data_parallel_size, config.cache.block_size)
        self._rank_of: dict[str, int] = {}
        """Request id -> the data-parallel rank all its samples run on."""
        self._groups: dict[str, RequestGroup] = {}
        self._samples: dict[str, tuple[RequestGroup, Sample]] = {}
        self._holding_back: dict[str, RequestGroup] = {}
        """Groups (n > 1) whose later samples wait for the first one's prefill; the only ones step() checks."""
        self._seed_rng = random.Random(config.seed)
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._num_steps = 0
        self._in_flight: Optional[list[tuple[SchedulerOutput, PendingSample]]] = None
        """Async scheduling: each rank's step launched ahead, whose tokens the next step() call applies."""
        self.last_step_hidden = False
        """Async scheduling: in the last step(), the next step was launched while the device still computed this one,
        so the host work of the call ran beside the device's (the bench's step probe reads it)."""
        self._needs_tokens_on_host: set[str] = set()
        """Unfinished requests whose next token depends on the last one on the host (a grammar, output penalties):
        while any is, async scheduling waits for each step's tokens before planning the next."""
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        """Structured outputs: compiles each constrained request's grammar when it is added."""
        self.advisor = PrefixAdvisor() if config.cache.enable_prefix_caching else None
        """Counts prompt tokens the prefix cache missed only because the prompt diverged earlier."""
        self.followers: Optional[FollowerLink] = None
        """Multi-host only (this is process 0): the other processes, which run every step this one plans."""
        if is_multi_process():
            self.followers = FollowerLink(self.runner.ladder.buckets(), self.runner.pages_per_seq,
                                          distributed_timeout_s)
            for rank, runner in enumerate(self.runners):
                runner.before_step = functools.partial(self.followers.publish_step, rank)
                runner.before_copy = functools.partial(self.followers.publish_copies, rank)
        self.warmup_seconds = sum(runner.warmup() for runner in self.runners) if warmup else 0.0
        if self.kv_tiers is not None:
            choose_min_load_blocks(config.cache.kv_offload_min_load_blocks, self.runner, self.schedulers,
                                   self.max_model_len)
        if self.followers is not None:
            self.followers.warm_up()  # the followers warm up in the same order (multihost/follower.py)

    @classmethod
    def from_options(cls, model: Optional[str] = None, *, revision: Optional[str] = None,
                     distributed_timeout_s: float = DEFAULT_TIMEOUT_S, **engine_options) -> "LLMEngine":
        """Load `model` (None: the embedded SmolLM2-135M-Instruct; `revision`: of a Hugging Face repo id) with flat
        engine options, and warm up."""
        config = EngineConfig.from_options(**engine_options)
        if config.compilation_cache_dir != "":
            enable_persistent_compilation_cache(config.compilation_cache_dir)
        return cls(load_model(model, revision=revision), config, distributed_timeout_s=distributed_timeout_s)

    # ---- requests --------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptInput, sampling_params: Optional[SamplingParams] = None,
                    *, arrival_time: Optional[float] = None) -> None:
        """Queue a request; ValueError naming the problem (and nothing changed) on bad input."""
        params = sampling_params or self.default_sampling_params()
        if request_id in self._groups:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        parsed = parse_prompt(prompt, self.tokenizer, self.vocab_size)
        params.validate_token_ids(self.vocab_size)
        num_prompt = len(parsed.token_ids)
        if num_prompt + params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) "
                             f"exceeds max_model_len ({self.max_model_len})")
        arrival_time = time.time() if arrival_time is None else arrival_time
        # A bad schema, regex or grammar is refused here, before anything is queued (never mid-stream).
        grammar = self.grammars.compile(params.structured_outputs) if params.structured_outputs else None
        samples = [self._make_sample(request_id, index, parsed, params, arrival_time) for index in range(params.n)]
        if grammar is not None:
            for s in samples:
                s.request.grammar = self.grammars.new_request_grammar(grammar)
        rank = self._route(samples[0].request)
        self.schedulers[rank].add_request(samples[0].request)  # validates against the pool before anything is kept
        self._rank_of[request_id] = rank
        if self.advisor is not None:
            hit_tokens = self.schedulers[rank].kv_cache_manager.find_prefix_hit(samples[0].request).num_tokens
            self.advisor.admit(parsed.token_ids, parsed.cache_salt, hit_tokens,
                               self.tokenizer.decode if self.config.advisor_log_text else None)
        group = RequestGroup(request_id, parsed, params, samples, arrival_time)
        self._groups[request_id] = group
        if params.n > 1:
            self._holding_back[request_id] = group
        for s in samples:
            self._samples[s.request.request_id] = (group, s)
        if grammar is not None or penalizes_output_tokens(params):
            self._needs_tokens_on_host.add(request_id)
        self._prompt_tokens_total += num_prompt * params.n

    def _make_sample(self, request_id, index, parsed, params: SamplingParams, arrival_time) -> Sample:
        sample_id = request_id if params.n == 1 else f"{request_id}#{index}"
        seed = self._seed_rng.getrandbits(63) if params.seed is None else params.seed + index
        request = Request(
            sample_id, parsed.token_ids, max_tokens=params.max_tokens, min_tokens=params.min_tokens,
            eos_token_id=self.eos_token_ids[0] if self.eos_token_ids else None,
            stop_token_ids=list(params.stop_token_ids or ()) + self.eos_token_ids[1:], ignore_eos=params.ignore_eos,
            arrival_time=arrival_time, priority=parsed.priority, cache_salt=parsed.cache_salt,
            sampling_params=params, sampling_seed=seed,
            computes_whole_prompt=params.prompt_logprobs is not None and index == 0)
        detokenizer = IncrementalDetokenizer(
            self.tokenizer, parsed.token_ids, skip_special_tokens=params.skip_special_tokens,
            stop=params.stop or (), include_stop_str_in_output=params.include_stop_str_in_output)
        return Sample(index, request, detokenizer)

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the model's recommended settings (generation_config.json), as vLLM does."""
        return SamplingParams(**self.sampling_defaults)

    def abort_request(self, request_ids: Union[str, Iterable[str]]) -> None:
        """Drop requests now and free their KV blocks; unknown ids are ignored."""
        for request_id in [request_ids] if isinstance(request_ids, str) else list(request_ids):
            group = self._groups.pop(request_id, None)
            if group is None:
                continue
            self._holding_back.pop(request_id, None)
            self._needs_tokens_on_host.discard(request_id)
            sample_ids = [s.request.request_id for s in group.samples]
            self.schedulers[self._rank_of.pop(request_id)].finish_requests(sample_ids, RequestStatus.FINISHED_ABORTED)
            for sample_id in sample_ids:
                self._samples.pop(sample_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._groups)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block on every data-parallel rank; False (nothing changed) while requests run."""
        if self.has_unfinished_requests():
            return False
        if self.advisor is not None:
            self.advisor.forget()  # what it remembers is what the cache held
        if self.kv_tiers is not None:
            self.kv_tiers.clear_host()  # the disk tier persists: that is what it is for
        return all([scheduler.reset_prefix_cache() for scheduler in self.schedulers])

    # ---- the step --------------------------------------------------------------------------------------------
    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """Schedule, run the model (and sample), update; returns the outputs of requests that progressed, or with
        `final_only` of those that finished (vLLM's FINAL_ONLY output kind: offline callers skip building a
        cumulative output per running request per step)."""
        self._release_held_back_samples()
        if self.config.async_scheduling:
            return self._step_ahead(final_only)
        outputs = []
        with self.followers.guard("an engine step") if self.followers else contextlib.nullcontext():
            # With one rank this is schedule -> execute -> update.
            launched = self._launch_ranks()
            for rank, (output, pending) in enumerate(launched):
                outputs += self.update(output, pending.result(), rank, final_only)
        self._num_steps += 1
        return outputs

    def _step_ahead(self, final_only: bool) -> list[RequestOutput]:
        """step() with async scheduling: the next step is planned and launched before this one's tokens are
        applied, so the host work of both runs while the device computes. The tokens of a step still in flight
        reach the next step on the device (ModelRunner.launch); a request that finishes in this step has one
        more row computed, whose token is dropped, and one that finishes by length is not planned past it."""
        launched = self._in_flight if self._in_flight is not None else self._launch_ranks()
        self._in_flight = None
        self.last_step_hidden = False
        if not self._needs_tokens_on_host and any(s.has_unfinished_requests() for s in self.schedulers):
            self._in_flight = self._launch_ranks()
            self.last_step_hidden = all(pending.is_running() for _, pending in launched)
        outputs = []
        for rank, (output, pending) in enumerate(launched):
            outputs += self.update(output, pending.result(), rank, final_only)
        if not self._groups:
            self._in_flight = None  # every request it computes for has finished: its tokens would be dropped
        self._num_steps += 1
        return outputs

    def _launch_ranks(self) -> list[tuple[SchedulerOutput, PendingSample]]:
        """Plan and launch one step on every data-parallel rank. Every rank's step is dispatched before any result
        is awaited, so the ranks' device groups run at the same time."""
        launched = []
        for scheduler, runner in zip(self.schedulers, self.runners):
            output = scheduler.schedule()
            pending = runner.launch(output)
            if self.followers is not None:
                # Multi-host: every process must issue its collectives in the same order, and the followers
                # finish a rank's step before they join the next plan's broadcast; so does process 0.
                pending.wait()
            launched.append((output, pending))
        return launched

    def output_token_counts(self) -> dict[str, int]:
        """Tokens generated so far by each unfinished request (all its samples), without building its output."""
        return {request_id: sum(len(sample.request.output_token_ids) for sample in group.samples)
                for request_id, group in self._groups.items()}

    def heartbeat(self) -> None:
        """Called while idle: multi-host, checks the followers are alive every so often; otherwise nothing."""
        if self.followers is not None:
            self.followers.heartbeat_if_due()

    def close(self) -> None:
        """Persists the KV cache to the disk tier (when one is on) and, multi-host, tells the followers to exit.
        Call once no step will run again."""
        if self.kv_tiers is not None and self.kv_tiers.has_disk:
            persist_kv_cache(self.kv_tiers, self.runners, self.schedulers)
        if self.followers is not None:
            self.followers.shutdown_followers()

    def update(self, output: SchedulerOutput, result: StepResult, rank: int = 0,
               final_only: bool = False) -> list[RequestOutput]:
        """Apply a rank's step: scheduler state, stop checks, text and logprobs; the RequestOutputs (with
        `final_only`, of finished requests only)."""
        scheduler = self.schedulers[rank]
        updated = scheduler.update_from_output(output, result.token_ids)
        touched: dict[str, RequestGroup] = {}
        sample_finished: dict[str, RequestGroup] = {}
        for entry in result.prompt_logprobs:
            owner = self._samples.get(entry.request_id)
            if owner is not None:
                owner[0].record_prompt_logprob(entry.position, entry.logprob, entry.rank, entry.top, self.tokenizer)
        # NOTE: this loop runs for every running request, every step: what it reads is what a step's host time is.
        logprobs = result.logprobs
        row_of = None
        if logprobs is not None:  # the row of each sampled request in the step's results
            row_of = {item.request.request_id: row for row, item in enumerate(i for i in output.scheduled if i.sample)}
        samples, tokenizer = self._samples, self.tokenizer
        stopped_by_string = []
        for request in updated:
            group, sample_state = samples[request.request_id]
            token_id = request.output_token_ids[-1]  # the step's token, just appended by update_from_output
            sampled_logprob, top, sampled_rank = 0.0, None, None
            if row_of is not None and logprobs is not None:
                sampled_logprob, top, sampled_rank = logprobs.row(row_of[request.request_id],
                                                                  group.params.logprobs or 0)
            grammar_complete = False
            if request.grammar is not None and not request.is_finished():
                request.grammar.accept(token_id)
                grammar_complete = request.grammar.is_finished
            group.record_token(sample_state, token_id, top, sampled_logprob, tokenizer, sampled_rank,
                               grammar_complete)
            if sample_state.finish_reason is not None:
                if not request.is_finished():
                    stopped_by_string.append(request.request_id)  # a stop string, or its grammar completed
                sample_finished[group.request_id] = group
            if not final_only:
                touched[group.request_id] = group
        self._generation_tokens_total += len(updated)
        if stopped_by_string:
            scheduler.finish_requests(stopped_by_string, RequestStatus.FINISHED_STOPPED)
        # A group finishes only in a step where one of its samples does: final_only asks just those.
        candidates = sample_finished if final_only else touched
        outputs = [group.to_output() for group in candidates.values() if not final_only or group.finished()]
        for out in outputs:
            if out.finished:
                self._forget(out.request_id)
        return outputs

    def _release_held_back_samples(self) -> None:
        for request_id, group in list(self._holding_back.items()):
            if group.ready_to_release():
                for held in group.held_back():
                    self.schedulers[self._rank_of[request_id]].add_request(held.request)
                group.num_released = len(group.samples)
                del self._holding_back[request_id]

    def _route(self, request: Request) -> int:
        """The data-parallel rank with the longest prefix for the request, then the least loaded."""
        loads = [scheduler.num_running + scheduler.num_waiting for scheduler in self.schedulers]
        return self._router.route(
            request, lambda rank, r: self.schedulers[rank].kv_cache_manager.find_prefix_hit(r).num_tokens, loads)

    def _forget(self, request_id: str) -> None:
        self._rank_of.pop(request_id, None)
        self._needs_tokens_on_host.discard(request_id)
        group = self._groups.pop(request_id)
        self._holding_back.pop(request_id, None)
        for s in group.samples:
            self._samples.pop(s.request.request_id, None)

    # ---- start-up and stats ----------------------------------------------------------------------------------
    def get_stats(self) -> EngineStats:
        """Gauges and cumulative counters."""
        ranks = [scheduler.stats() for scheduler in self.schedulers]
        total = lambda field: sum(getattr(stats, field) for stats in ranks)
        return EngineStats(
            num_running=total("num_running"), num_waiting=total("num_waiting"),
            kv_cache_usage=total("kv_cache_usage") / len(ranks),
            prefix_cache_queries=total("prefix_cache_queries"), prefix_cache_hits=total("prefix_cache_hits"),
            num_preemptions=total("num_preemptions"), num_compilations=compile_counter.num_compilations(),
            prompt_tokens_total=self._prompt_tokens_total, generation_tokens_total=self._generation_tokens_total,
            num_steps=self._num_steps, warmup_seconds=self.warmup_seconds,
            # `is not None`: an advisor with nothing remembered (just reset) has len() 0, so it is falsy.
            prefix_cache_missed_reusable_tokens=(self.advisor.missed_reusable_tokens
                                                 if self.advisor is not None else 0),
            kv_tiers=tier_stats(self.kv_tiers, self.runners, self.schedulers, total("prefix_cache_hits"),
                                total("kv_cache_usage") / len(ranks)) if self.kv_tiers is not None else {})


def enable_persistent_compilation_cache(directory: Optional[str]) -> None:
    """JAX's on-disk executable cache, so a restart loads instead of compiling."""
    from jaxpaged.weights.loader import cache_root

    path = directory or str(cache_root() / "xla")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
