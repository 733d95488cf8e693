"""The scheduler's random add / step / abort / finish machine (test_scheduler_stateful.py) with KV cache groups: a
full group beside sliding ones, or sliding groups alone, over a tiny pool and, drawn on, the fake KV tiers (a
"damaging" one among them). The fake runner tags every K/V slot with its group: each step reads back, through each
group's own table, the request's tokens over the whole prefix (full groups) or the window (sliding groups), so a
block loaded from a tier entry of another group, a hit past a sliding group's window or a block given back too early
fails the read."""

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant

from jaxpaged.config import CacheConfig, SchedulerConfig
from jaxpaged.core import NULL_BLOCK_ID, Request, Scheduler
from jaxpaged.core.kv_cache_groups import sequence_blocks
from tests.core.test_scheduler_stateful import _SETTINGS, FakeLowerTiers, SchedulerMachine

GROUP_WINDOWS = [(None, 2), (None, 3, 3), (5, None), (3,), (None, 1)]


class GroupedSchedulerMachine(SchedulerMachine):
    """SchedulerMachine over per-group block tables."""

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_kv_blocks=st.integers(4, 16),
                max_num_seqs=st.integers(1, 4), extra_budget=st.integers(0, 12), max_model_len=st.integers(2, 24),
                threshold=st.sampled_from([0, 0, 1, 3, 5]), policy=st.sampled_from(["fcfs", "priority"]),
                caching=st.sampled_from([True, True, True, False]),
                granularity=st.sampled_from(["token", "block", "block"]),
                tiers=st.sampled_from([None, "big", "big", "big", "small", "damaging"]),
                min_load_blocks=st.integers(1, 2),
                windows=st.sampled_from(GROUP_WINDOWS))
    def build(self, block_size, num_kv_blocks, max_num_seqs, extra_budget, max_model_len, threshold, policy, caching,
              granularity, tiers, min_load_blocks, windows):
        self.config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_seqs + extra_budget,
                                      max_model_len=max_model_len, long_prefill_token_threshold=threshold,
                                      scheduling_policy=policy)
        self.block_size = block_size
        self.windows = windows
        self.tiers = None if tiers is None else FakeLowerTiers(3 if tiers == "small" else 1000, tiers == "damaging")
        self.scheduler = Scheduler(self.config, CacheConfig(block_size=block_size, enable_prefix_caching=caching,
                                                               prefix_caching_granularity=granularity),
                                   num_kv_blocks, lower_tiers=self.tiers, kv_group_windows=windows)
        self.scheduler.kv_cache_manager.min_load_blocks = min_load_blocks
        self.all_requests: dict[str, Request] = {}
        self.fake_kv: dict[tuple[int, int], Any] = {}  # (block, offset) -> (group, token, cache salt)
        self.next_id = 0

    def _num_blocks_for(self, num_tokens: int) -> int:
        return sequence_blocks(num_tokens, self.block_size, self.windows, self.config.max_num_batched_tokens)

    def _run_fake_attention(self, scheduled):
        """Write the step's tokens into each group's slots, then read back what each group's queries read: the
        whole prefix in a full group, positions start - w + 1 on in a sliding group of window w."""
        request, block_size = scheduled.request, self.block_size
        start, end = scheduled.start_position, scheduled.start_position + len(scheduled.token_ids)
        assert scheduled.token_ids == request.all_token_ids[start:end]
        # One group (sliding alone) travels as the plain block table.
        tables = scheduled.group_block_ids if len(self.windows) > 1 else (scheduled.block_ids,)
        assert len(tables) == len(self.windows)
        for group, (window, block_ids) in enumerate(zip(self.windows, tables)):
            assert len(block_ids) * block_size >= end
            for offset, token in enumerate(scheduled.token_ids):
                position = start + offset
                block_id = block_ids[position // block_size]
                assert block_id != NULL_BLOCK_ID, f"group {group} writes position {position} to the null block"
                self.fake_kv[(block_id, position % block_size)] = (group, token, request.cache_salt)
            first = 0 if window is None else max(start - window + 1, 0)
            for position in range(first, end):
                slot = (block_ids[position // block_size], position % block_size)
                assert slot[0] != NULL_BLOCK_ID, f"group {group} lost position {position} of its window"
                assert self.fake_kv.get(slot) == (group, request.all_token_ids[position], request.cache_salt), \
                    f"{request.request_id} reads a wrong K/V at position {position} in group {group}"

    @invariant()
    def blocks_are_accounted_for(self):
        kv = self.scheduler.kv_cache_manager
        pool = kv.block_pool
        free_ids = pool.free_block_ids()
        assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks
        holders = {block_id: 0 for block_id in range(pool.num_blocks)}
        for request in self.scheduler.running:
            for table in kv.get_group_block_ids(request.request_id):
                for block_id in table:
                    if block_id != NULL_BLOCK_ID:
                        holders[block_id] += 1
        for block in pool.blocks:
            assert block.ref_cnt == holders[block.block_id], f"block {block.block_id} ref count"
            assert not (block.ref_cnt > 0 and block.block_id in free_ids), "a block is both free and referenced"
        num_referenced = sum(1 for block in pool.blocks if block.ref_cnt > 0)
        assert NULL_BLOCK_ID not in free_ids and pool.null_block.ref_cnt == 0
        assert len(free_ids) + num_referenced + 1 == pool.num_blocks


TestGroupedSchedulerStateMachine = GroupedSchedulerMachine.TestCase
TestGroupedSchedulerStateMachine.settings = settings(max_examples=100, stateful_step_count=60, database=None,
                                                     **_SETTINGS)


class GroupedSchedulerMachineLong(GroupedSchedulerMachine):
    """The same machine, many more and longer runs."""


TestGroupedSchedulerStateMachineLong = pytest.mark.slow(GroupedSchedulerMachineLong.TestCase)
TestGroupedSchedulerStateMachineLong.settings = settings(max_examples=1500, stateful_step_count=100, **_SETTINGS)
