"""Scheduler: one token-budget loop with no prefill/decode phases (chunked prefill, prefix hits, recompute preemption).

Each step hands out max_num_batched_tokens so every request's num_computed_tokens catches up with its token
count: running requests first (in admission order), then waiting ones while fewer than max_num_seqs run.

NOTE: num_computed_tokens advances in schedule(), as in vLLM V1: once a step is scheduled its tokens count
as computed. update_from_output() then makes their full blocks hittable (the runner has written their K/V
by then) and appends the sampled tokens, whose K/V a later step computes. With async scheduling the engine calls
schedule() for step N+1 before update_from_output() of step N: a request whose token is still in flight
(Request.num_pending_tokens) gets a one-token step with a placeholder the runner fills on the device.

Speculative decoding: a decoding request's proposals (Request.spec_token_ids) ride its row, counted as computed
until update_from_output() keeps the accepted ones and rolls the rest back (spec_verification.py).

The step's concerns live beside it: running_rows.py (chunks, decodes, tokens in flight, speculative rows),
preemption.py (who gives its blocks back) and admission.py (waiting requests at their prefix hits).
"""

from collections.abc import Iterable, Sequence
from typing import Optional

from ..checks import is_int
from ..config import CacheConfig, SchedulerConfig
from .admission import Admission
from .kv_cache_groups import GroupedKVCacheManager
from .kv_cache_manager import KVCacheManager
from .lower_tiers import LowerTiers
from .preemption import Preemption
from .request import Request, RequestStatus
from .request_queue import make_request_queue
from .request_validation import validate_new_request
from .running_rows import RunningRows
from .scheduler_output import ScheduledRequest, SchedulerOutput
from .scheduler_stats import SchedulerStats
from .spec_decode_stats import SpecDecodeStats
from .spec_verification import append_verified_tokens
from .stop_criteria import check_stop

_RUNNING = RequestStatus.RUNNING


class Scheduler:
    """Decides, step by step, which tokens of which requests the model computes, and keeps their KV blocks."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_kv_blocks: int,
                 lower_tiers: Optional[LowerTiers] = None, max_spec_tokens_per_step: int = 0,
                 kv_group_windows: Sequence[Optional[int]] = (None,), max_loras: int = 0) -> None:
        """lower_tiers: host and disk tiers below the device pool (jaxpaged/kv_tiers), if on.
        kv_group_windows: per KV layer group (runner/kv_spec.py), its sliding window or None for full attention;
        any window makes block tables per group that keep only the window (core/kv_cache_groups.py).
        max_spec_tokens_per_step: most proposals one step verifies (0: speculative decoding off). Each verified
        proposal takes a sampling row, and a step has max_num_seqs of them: sequences plus proposals stay within it.
        max_loras: most LoRA adapters running requests use at once (the runner's device slots; 0: LoRA off)."""
        if not is_int(num_kv_blocks) or num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks: must be an int >= 2 (block 0 is the null block), got {num_kv_blocks!r}")
        self.max_num_seqs = scheduler_config.max_num_seqs
        self.max_num_batched_tokens = scheduler_config.max_num_batched_tokens
        if scheduler_config.max_model_len is None:  # the engine settles it from the model and the pool first
            raise ValueError("max_model_len: the scheduler needs a number (None is resolved by the engine)")
        self.max_model_len: int = scheduler_config.max_model_len
        self.block_size = cache_config.block_size
        token_granular = cache_config.prefix_caching_granularity == "token"
        self.kv_cache_manager: KVCacheManager
        if all(window is None for window in kv_group_windows):
            self.kv_cache_manager = KVCacheManager(num_kv_blocks, cache_config.block_size,
                                                   cache_config.enable_prefix_caching, token_granular=token_granular,
                                                   lower_tiers=lower_tiers)
        else:
            self.kv_cache_manager = GroupedKVCacheManager(num_kv_blocks, cache_config.block_size, kv_group_windows,
                                                          cache_config.enable_prefix_caching, token_granular,
                                                          lower_tiers)
        self._grouped = self.kv_cache_manager.num_groups > 1
        """The runner reads a block table per group (ScheduledRequest.group_block_ids)."""
        """Block tables and the prefix cache (num_kv_blocks counts the null block 0)."""
        self.requests: dict[str, Request] = {}
        """Every unfinished request, by id."""
        self.waiting = make_request_queue(scheduler_config.scheduling_policy)
        """New and preempted requests, in admission order of the policy."""
        self.running: list[Request] = []
        """Requests holding KV blocks, in admission order."""
        self._finished_request_ids: set[str] = set()
        self.spec_stats = SpecDecodeStats()
        """Speculative decoding: proposals verified and accepted so far (cumulative, by position)."""
        self._preemption = Preemption(self.kv_cache_manager, self.waiting, scheduler_config.scheduling_policy)
        threshold = scheduler_config.long_prefill_token_threshold
        self._running_rows = RunningRows(self.kv_cache_manager, self._preemption, self.max_num_batched_tokens,
                                         self.max_num_seqs, self.max_model_len, threshold, max_spec_tokens_per_step)
        """This step's rows of the running requests (running_rows.py)."""
        self._admission = Admission(self.kv_cache_manager, self.waiting, self.max_num_seqs, threshold, max_loras)
        """Waiting requests into the step (admission.py)."""

    # ---- requests in and out ----

    def add_request(self, request: Request) -> None:
        """Queue a new request; ValueError naming the problem (and nothing changed) if it can never run."""
        kv = self.kv_cache_manager
        validate_new_request(request, self.requests, self.max_model_len, self.block_size,
                             kv.block_pool.num_usable_blocks,
                             lambda num_tokens: kv.blocks_for_tokens(num_tokens, self.max_num_batched_tokens))
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """Finish requests now (abort, or a stop string the engine found) and free their blocks; ignores unknown ids."""
        if not isinstance(status, RequestStatus) or not status.is_finished():
            raise ValueError(f"status: must be a FINISHED_* RequestStatus, got {status!r}")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        any_running = False
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status is _RUNNING:
                any_running = True
            else:
                self.waiting.remove(request)
            request.status = status
            self._release(request)
        if any_running:
            self.running = [request for request in self.running if request.status is _RUNNING]

    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.running) or len(self.waiting) > 0

    @property
    def num_running(self) -> int:
        """Requests holding KV blocks."""
        return len(self.running)

    @property
    def num_preemptions(self) -> int:
        """Preemptions since start."""
        return self._preemption.num_preemptions

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission."""
        return len(self.waiting)

    def get_request(self, request_id: str) -> Optional[Request]:
        """An unfinished request by id, else None."""
        return self.requests.get(request_id)

    def stats(self) -> SchedulerStats:
        """Counts, KV usage and cumulative counters for /metrics."""
        kv = self.kv_cache_manager
        return SchedulerStats(num_running=len(self.running), num_waiting=len(self.waiting),
                              kv_cache_usage=kv.usage, num_preemptions=self.num_preemptions,
                              prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request holds blocks."""
        return self.kv_cache_manager.reset_prefix_cache()

    # ---- one step ----

    def schedule(self) -> SchedulerOutput:
        """Choose this step's tokens: running requests first, then admissions; advances num_computed_tokens."""
        scheduled: list[ScheduledRequest] = []
        preempted_request_ids: set[str] = set()
        budget, num_spec_rows = self._running_rows.schedule(self.running, scheduled, preempted_request_ids)
        # A step that had to preempt is short of blocks: admitting more would only preempt again.
        if not preempted_request_ids:
            budget = self._admission.admit(self.running, scheduled, budget, num_spec_rows)
        finished_request_ids, self._finished_request_ids = self._finished_request_ids, set()
        kv = self.kv_cache_manager
        saves, loads = kv.take_tier_transfers()
        self._cache_scheduled_blocks(scheduled)
        if self._grouped:
            for item in scheduled:
                item.group_block_ids = kv.get_group_block_ids(item.request.request_id)
        return SchedulerOutput(scheduled=scheduled, num_scheduled_tokens=self.max_num_batched_tokens - budget,
                               finished_request_ids=finished_request_ids,
                               preempted_request_ids=preempted_request_ids,
                               block_copies=kv.take_block_copies(), kv_saves=saves, kv_loads=loads)

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: list[int]) -> list[Request]:
        """Cache the step's full blocks, append sampled tokens, apply stop criteria and free finished requests.

        sampled_token_ids (plain ints: pass ndarray.tolist()) holds, for each scheduled request with sample=True in
        order, its draw, followed by one draw per proposal of a speculative row. Returns the requests that received
        tokens (Request.num_step_tokens says how many), finished ones included.
        """
        num_sampled_rows = output.num_sampled_rows
        if len(sampled_token_ids) != num_sampled_rows:
            raise ValueError(f"sampled_token_ids: expected {num_sampled_rows} (one per sampling request and "
                             f"proposal), got {len(sampled_token_ids)}")
        cache_full_blocks = self.kv_cache_manager.cache_full_blocks
        block_size = self.block_size
        max_model_len = self.max_model_len
        updated_requests = []
        any_finished = False
        sample_index = 0
        for scheduled_request in output.scheduled:
            request = scheduled_request.request
            sample = scheduled_request.sample
            if sample:
                token_id = sampled_token_ids[sample_index]
                sample_index += 1
            if request.status is not _RUNNING:
                sample_index += scheduled_request.num_spec_tokens
                continue  # finished by finish_requests() (or preempted) after this step was scheduled
            if scheduled_request.num_spec_tokens:
                num_rows = 1 + scheduled_request.num_spec_tokens
                rows = sampled_token_ids[sample_index - 1:sample_index - 1 + num_rows]
                sample_index += num_rows - 1
                updated_requests.append(request)
                if self._apply_verified_row(scheduled_request, rows):
                    any_finished = True
                continue
            if sample:
                request.num_step_tokens = 1
                request.append_output_token(token_id)
                request.num_pending_tokens -= 1
                updated_requests.append(request)
            # A one-token step fills a block only when it took the block's last slot (most decodes do not). The
            # token is appended first: with a step planned ahead, the blocks hashed reach one token further.
            if len(scheduled_request.token_ids) != 1 or (scheduled_request.start_position + 1) % block_size == 0:
                cache_full_blocks(request)
            if not sample:
                continue
            if check_stop(request, max_model_len):
                self._release(request)
                any_finished = True
        if any_finished:
            self.running = [request for request in self.running if request.status is _RUNNING]
        return updated_requests

    # ---- internals ----

    def _apply_verified_row(self, scheduled_request: ScheduledRequest, sampled: list[int]) -> bool:
        """A speculative row's outcome (spec_verification.py): the accepted proposals and the draw after them are
        appended, the rejected proposals' K/V slots rolled back (blocks allocated only for them freed); only
        computed, accepted tokens reach the prefix cache. True if the request finished (and was released)."""
        request = scheduled_request.request
        proposals = scheduled_request.token_ids[1:]
        num_accepted, finished = append_verified_tokens(request, proposals, sampled, self.max_model_len)
        self.spec_stats.record(len(proposals), num_accepted)
        kv = self.kv_cache_manager
        kv.trim_blocks(request)
        kv.cache_full_blocks(request)
        if finished:
            self._release(request)
        return finished

    def _cache_scheduled_blocks(self, scheduled: list[ScheduledRequest]) -> None:
        """Make the full blocks this step will write hittable now, not when its tokens come back.

        Steps run on the device in order, so a request admitted by the next schedule() can share blocks this step
        computes. With async scheduling that next schedule() comes before this step's update_from_output(): hashed
        only there, a burst of requests behind one shared prompt would miss it. Not for this very step (its
        admissions looked up the cache before), and not a row whose input token is still in flight (its id is
        unknown until update_from_output() appends it, which caches that block then).
        """
        cache_full_blocks = self.kv_cache_manager.cache_full_blocks
        block_size = self.block_size
        for scheduled_request in scheduled:
            if scheduled_request.input_in_flight or scheduled_request.num_spec_tokens:
                continue  # (a speculative row's num_computed_tokens counts proposals that may be rejected)
            if len(scheduled_request.token_ids) != 1 or (scheduled_request.start_position + 1) % block_size == 0:
                cache_full_blocks(scheduled_request.request)

    def _release(self, request: Request) -> None:
        """Forget a request that just finished (its status already set) and free its blocks."""
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self._finished_request_ids.add(request.request_id)
