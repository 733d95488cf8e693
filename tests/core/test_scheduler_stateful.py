"""Random add / step / abort / finish sequences against a tiny pool, with the block and request invariants
checked after every rule, and a fake runner that proves every block table reads back the request's own tokens.

With lower KV tiers drawn on, a fake tier (a bounded LRU of block contents, optionally "damaging" some entries so
their fetch fails) takes the evicted blocks and serves loads: the read-back proves those moves are right too."""

import collections
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from jaxpaged.config import CacheConfig, SchedulerConfig
from jaxpaged.core import NULL_BLOCK_ID, Request, RequestStatus, Scheduler

TOKENS = st.integers(min_value=0, max_value=2)  # a tiny vocabulary: prompts share prefixes often
FINISHED_STATUSES = [RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH]


class FakeLowerTiers:
    """A LowerTiers of block contents: bounded LRU; with damaging, every third fetched key fails its "checksum"."""

    def __init__(self, capacity_blocks: int, damaging: bool) -> None:
        self.capacity_blocks = capacity_blocks
        self.damaging = damaging
        self.blocks: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()
        self.num_fetches = 0

    def holds(self, block_hash: bytes) -> bool:
        return block_hash in self.blocks

    def touch(self, block_hash: bytes) -> None:
        self.blocks.move_to_end(block_hash)

    def fetch(self, block_hash: bytes) -> Optional[object]:
        self.num_fetches += 1
        if self.damaging and self.num_fetches % 3 == 0:
            del self.blocks[block_hash]  # a damaged entry is removed
            return None
        self.blocks.move_to_end(block_hash)
        return self.blocks[block_hash]

    def store(self, block_hash: bytes, contents: tuple) -> None:
        self.blocks[block_hash] = contents
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)


class SchedulerMachine(RuleBasedStateMachine):
    """Drives one Scheduler; the model is the set of requests ever added and a fake paged KV cache."""

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_kv_blocks=st.integers(2, 14),
                max_num_seqs=st.integers(1, 4), extra_budget=st.integers(0, 12), max_model_len=st.integers(2, 24),
                threshold=st.sampled_from([0, 0, 1, 3, 5]), policy=st.sampled_from(["fcfs", "priority"]),
                caching=st.sampled_from([True, True, False]), granularity=st.sampled_from(["token", "token", "block"]),
                tiers=st.sampled_from([None, None, "big", "small", "damaging"]), min_load_blocks=st.integers(1, 3))
    def build(self, block_size, num_kv_blocks, max_num_seqs, extra_budget, max_model_len, threshold, policy, caching,
              granularity, tiers, min_load_blocks):
        self.config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_seqs + extra_budget,
                                      max_model_len=max_model_len, long_prefill_token_threshold=threshold,
                                      scheduling_policy=policy)
        self.block_size = block_size
        self.tiers = None if tiers is None else FakeLowerTiers(3 if tiers == "small" else 1000, tiers == "damaging")
        self.scheduler = Scheduler(self.config, CacheConfig(block_size=block_size, enable_prefix_caching=caching,
                                                               prefix_caching_granularity=granularity),
                                   num_kv_blocks, lower_tiers=self.tiers)
        self.scheduler.kv_cache_manager.min_load_blocks = min_load_blocks
        self.all_requests: dict[str, Request] = {}
        self.fake_kv: dict[tuple[int, int], tuple[int, object]] = {}  # (block, offset) -> (token, cache salt)
        self.next_id = 0

    def _num_blocks_for(self, num_tokens: int) -> int:
        """The blocks a request holding `num_tokens` of KV needs at most (one block table)."""
        return -(-num_tokens // self.block_size)

    # ---- rules ----

    @rule(prompt=st.lists(TOKENS, min_size=1, max_size=26), max_tokens=st.integers(1, 8),
          min_tokens=st.integers(0, 3), eos=st.sampled_from([None, 0, 1]), stop=st.sampled_from([(), (2,)]),
          ignore_eos=st.booleans(), priority=st.integers(0, 2), salt=st.sampled_from([None, None, "x", "y"]),
          reuse_id=st.booleans())
    def add(self, prompt, max_tokens, min_tokens, eos, stop, ignore_eos, priority, salt, reuse_id):
        live_ids = list(self.scheduler.requests)
        request_id = live_ids[0] if reuse_id and live_ids else f"r{self.next_id}"
        self.next_id += 1
        request = Request(request_id, prompt, max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens),
                          eos_token_id=eos, stop_token_ids=stop, ignore_eos=ignore_eos, priority=priority,
                          cache_salt=salt, arrival_time=float(self.next_id))
        # Independent prediction of the add-time checks (_num_blocks_for: a subclass counts per KV cache group).
        max_kv_tokens = max(len(prompt), min(len(prompt) + max_tokens, self.scheduler.max_model_len) - 1)
        usable_blocks = self.scheduler.kv_cache_manager.block_pool.num_usable_blocks
        expect_error = (request_id in live_ids or len(prompt) > self.scheduler.max_model_len
                        or self._num_blocks_for(max_kv_tokens) > usable_blocks)
        before = (self.scheduler.num_running, self.scheduler.num_waiting, self.scheduler.stats())
        if expect_error:
            with pytest.raises(ValueError):
                self.scheduler.add_request(request)
            assert (self.scheduler.num_running, self.scheduler.num_waiting, self.scheduler.stats()) == before
        else:
            self.scheduler.add_request(request)
            self.all_requests[request_id + f"#{self.next_id}"] = request

    @rule(sampled=st.lists(TOKENS, min_size=16, max_size=16))
    def step(self, sampled):
        self._step(sampled, abort_in_flight=None)

    @precondition(lambda self: self.scheduler.num_running > 0)
    @rule(sampled=st.lists(TOKENS, min_size=16, max_size=16), index=st.integers(0, 100),
          status=st.sampled_from(FINISHED_STATUSES))
    def step_with_finish_in_flight(self, sampled, index, status):
        self._step(sampled, abort_in_flight=(index, status))

    @rule(index=st.integers(0, 100), status=st.sampled_from(FINISHED_STATUSES), unknown=st.booleans())
    def finish(self, index, status, unknown):
        live_ids = list(self.scheduler.requests)
        if unknown or not live_ids:
            self.scheduler.finish_requests(["no-such-request"], status)
            return
        request_id = live_ids[index % len(live_ids)]
        request = self.scheduler.get_request(request_id)
        assert request is not None  # a live id
        self.scheduler.finish_requests([request_id], status)
        assert request.status is status and self.scheduler.get_request(request_id) is None
        assert self.scheduler.kv_cache_manager.get_block_ids(request_id) == []

    # ---- one engine step with a fake runner ----

    def _step(self, sampled, abort_in_flight):
        scheduler = self.scheduler
        decodes_before = {request.request_id for request in scheduler.running
                          if request.num_tokens - request.num_computed_tokens == 1}
        output = scheduler.schedule()
        assert output.num_scheduled_tokens == sum(len(s.token_ids) for s in output.scheduled)
        assert output.num_scheduled_tokens <= self.config.max_num_batched_tokens
        assert len(output.scheduled) <= self.config.max_num_seqs
        scheduled_ids = [s.request.request_id for s in output.scheduled]
        assert len(set(scheduled_ids)) == len(scheduled_ids)
        if not output.preempted_request_ids:
            assert decodes_before <= set(scheduled_ids), "a decode was starved"
        for request_id in output.preempted_request_ids:
            request = scheduler.get_request(request_id)
            assert request is not None
            assert request.status is RequestStatus.PREEMPTED and request.num_computed_tokens == 0
        self._move_fake_tier_blocks(output.kv_saves, output.kv_loads)
        self._copy_fake_blocks(output.block_copies)
        for scheduled in output.scheduled:
            self._run_fake_attention(scheduled)
        if abort_in_flight is not None:
            index, status = abort_in_flight
            scheduler.finish_requests([scheduled_ids[index % len(scheduled_ids)]] if scheduled_ids else [], status)
        samples = sampled[:output.num_sampled_requests] + [0] * max(0, output.num_sampled_requests - len(sampled))
        updated = scheduler.update_from_output(output, samples)
        assert all(request.output_token_ids for request in updated)

    def _move_fake_tier_blocks(self, saves, loads):
        """What the runner does first: copy evicted blocks' slots down to the tier, then loaded ones up."""
        if self.tiers is None:
            assert not saves and not loads
            return
        for block_id, block_hash in saves:
            assert block_id != NULL_BLOCK_ID
            self.tiers.store(block_hash, tuple(self.fake_kv.get((block_id, offset))
                                               for offset in range(self.block_size)))
        for block_id, contents in loads:
            assert block_id != NULL_BLOCK_ID and isinstance(contents, tuple)
            for offset, slot in enumerate(contents):
                self.fake_kv[(block_id, offset)] = slot

    def _copy_fake_blocks(self, block_copies):
        """What the runner does before the step: copy every slot of each source block into its destination."""
        for source, destination in block_copies:
            assert source != destination and NULL_BLOCK_ID not in (source, destination)
            for offset in range(self.block_size):
                self.fake_kv.pop((destination, offset), None)
                if (source, offset) in self.fake_kv:
                    self.fake_kv[(destination, offset)] = self.fake_kv[(source, offset)]

    def _run_fake_attention(self, scheduled):
        """Write the step's tokens into their slots, then read the whole prefix back through the block table."""
        request, block_ids, block_size = scheduled.request, scheduled.block_ids, self.block_size
        end = scheduled.start_position + len(scheduled.token_ids)
        assert scheduled.token_ids == request.all_token_ids[scheduled.start_position:end]
        assert scheduled.sample == (end == request.num_tokens)
        assert len(block_ids) * block_size >= end and NULL_BLOCK_ID not in block_ids
        for offset, token in enumerate(scheduled.token_ids):
            position = scheduled.start_position + offset
            self.fake_kv[(block_ids[position // block_size], position % block_size)] = (token, request.cache_salt)
        for position in range(end):
            slot = (block_ids[position // block_size], position % block_size)
            assert self.fake_kv.get(slot) == (request.all_token_ids[position], request.cache_salt), \
                f"{request.request_id} reads a wrong K/V at position {position}"

    # ---- invariants ----

    @invariant()
    def blocks_are_accounted_for(self):
        pool = self.scheduler.kv_cache_manager.block_pool
        free_ids = pool.free_block_ids()
        assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks
        holders = {block_id: 0 for block_id in range(pool.num_blocks)}
        for request in self.scheduler.running:
            for block_id in self.scheduler.kv_cache_manager.get_block_ids(request.request_id):
                holders[block_id] += 1
        for block in pool.blocks:
            assert block.ref_cnt >= 0
            assert block.ref_cnt == holders[block.block_id], f"block {block.block_id} ref count"
            assert not (block.ref_cnt > 0 and block.block_id in free_ids), "a block is both free and referenced"
        num_referenced = sum(1 for block in pool.blocks if block.ref_cnt > 0)
        assert NULL_BLOCK_ID not in free_ids and pool.null_block.ref_cnt == 0
        assert len(free_ids) + num_referenced + 1 == pool.num_blocks

    @invariant()
    def requests_respect_their_limits(self):
        for request in self.all_requests.values():
            assert request.num_output_tokens <= request.max_tokens
            assert request.num_tokens <= max(self.scheduler.max_model_len, request.num_prompt_tokens + 1)
            assert request.num_computed_tokens <= request.num_tokens
        for request in self.scheduler.running:
            assert request.status is RequestStatus.RUNNING
            block_ids = self.scheduler.kv_cache_manager.get_block_ids(request.request_id)
            assert len(block_ids) * self.block_size >= request.num_computed_tokens
        for request in self.scheduler.waiting:
            assert request.num_computed_tokens == 0
            assert self.scheduler.kv_cache_manager.get_block_ids(request.request_id) == []
        assert self.scheduler.num_running <= self.config.max_num_seqs

    @invariant()
    def idle_means_every_block_is_free(self):
        if not self.scheduler.has_unfinished_requests():
            pool = self.scheduler.kv_cache_manager.block_pool
            assert pool.num_free_blocks == pool.num_usable_blocks and self.scheduler.stats().kv_cache_usage == 0.0

    def teardown(self):
        """Every request finishes once the engine keeps stepping: no livelock, and the pool ends up empty."""
        if not hasattr(self, "scheduler"):
            return
        for _ in range(3000):
            if not self.scheduler.has_unfinished_requests():
                break
            self._step([1] * 16, abort_in_flight=None)
            self.blocks_are_accounted_for()
        assert not self.scheduler.has_unfinished_requests()
        assert all(request.is_finished() for request in self.all_requests.values())
        self.idle_means_every_block_is_free()
        self.scheduler.schedule()  # drains finished_request_ids
        assert self.scheduler.reset_prefix_cache() is True


_SETTINGS: dict[str, Any] = dict(deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestSchedulerStateMachine = SchedulerMachine.TestCase
TestSchedulerStateMachine.settings = settings(max_examples=150, stateful_step_count=40, **_SETTINGS)


class SchedulerMachineLong(SchedulerMachine):
    """The same machine, many more and longer runs."""


TestSchedulerStateMachineLong = pytest.mark.slow(SchedulerMachineLong.TestCase)
TestSchedulerStateMachineLong.settings = settings(max_examples=2000, stateful_step_count=100, **_SETTINGS)
