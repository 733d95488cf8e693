"""KV cache groups (core/kv_cache_groups.py): a sliding group keeps only the blocks its window reaches and gives the
rest back as a request advances; prefix hits need the whole prefix in full groups and only the window in sliding
ones; the layer grouping and the memory plan's sequences per pool, worked by hand."""

from typing import Optional

import numpy as np
import pytest

from jaxpaged.core.block_pool import NULL_BLOCK_ID
from jaxpaged.core.hashing import request_block_hash
from jaxpaged.core.kv_cache_groups import (
    GroupedKVCacheManager,
    group_key,
    max_sequence_tokens,
    sequence_blocks,
    sliding_blocks_skipped,
)
from jaxpaged.core.request import Request
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.runner.kv_spec import layer_groups
from jaxpaged.runner.memory_plan import fit_max_model_len, plan_memory

BLOCK = 4
WINDOW = 8


def prompt(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize(("computed", "expected"), [(0, 0), (1, 0), (WINDOW - 1, 0), (WINDOW, 0), (WINDOW + 1, 0),
                                                    (WINDOW + 3, 1), (WINDOW + 4, 1), (WINDOW + 7, 2), (100, 23)])
def test_blocks_before_the_window_of_the_next_query(computed, expected):
    """A query at position q reads q - w + 1 .. q: with w = 8 and 4-token blocks, block 0 (positions 0-3) is dead
    once the next query is at 11 (reads 4..11), worked by hand at the edge lengths."""
    assert sliding_blocks_skipped(computed, WINDOW, BLOCK) == expected
    first_read = max(computed - WINDOW + 1, 0)
    assert expected * BLOCK <= first_read < (expected + 1) * BLOCK or computed < WINDOW


def decode(kv: GroupedKVCacheManager, request: Request, num_tokens: int) -> list[int]:
    """Grow `request` one token at a time as the scheduler does (allocating at block starts); the sliding group's
    held block count after each token."""
    held = []
    for _ in range(num_tokens):
        start = request.num_computed_tokens
        if start % BLOCK == 0:
            assert kv.allocate_slots(request, 1) is not None
        request.num_computed_tokens += 1
        table = kv.get_group_block_ids(request.request_id)[1]
        assert table[start // BLOCK] != NULL_BLOCK_ID  # the token's own slot
        first_read = max(start - WINDOW + 1, 0)
        assert all(table[index] != NULL_BLOCK_ID for index in range(first_read // BLOCK, start // BLOCK + 1))
        held.append(sum(1 for block_id in table if block_id != NULL_BLOCK_ID))
    return held


@pytest.mark.parametrize("length", [1, WINDOW - 1, WINDOW, WINDOW + 1, 61])
def test_a_sliding_group_holds_its_window_and_frees_the_rest(length):
    """Decoding `length` tokens: the full group holds every block, the sliding group never more than
    ceil((w - 1) / block) + 1 = 3, every block its window reads is held, and the pool gets the rest back."""
    kv = GroupedKVCacheManager(64, BLOCK, (None, WINDOW))
    request = Request("r", prompt(length + 1))
    held = decode(kv, request, length)
    whole = -(-length // BLOCK)
    assert max(held) <= min(whole, 3)
    assert len(kv.get_group_block_ids("r")[0]) == whole
    assert kv.num_free_blocks == 63 - whole - held[-1]
    kv.free(request)
    assert kv.num_free_blocks == 63


def test_chunked_prefill_frees_behind_each_chunk_and_respects_the_bound():
    """A 40-token prompt in 8-token chunks: the sliding group keeps the window before each chunk and the chunk, at
    most blocks_for_tokens' bound, and the full group keeps all."""
    kv = GroupedKVCacheManager(64, BLOCK, (None, WINDOW))
    request = Request("r", prompt(40))
    for _ in range(5):
        assert kv.allocate_slots(request, 8) is not None
        request.num_computed_tokens += 8
        sliding = [b for b in kv.get_group_block_ids("r")[1] if b != NULL_BLOCK_ID]
        assert len(sliding) <= kv.blocks_for_tokens(40, 8) - 10
    assert len(kv.get_group_block_ids("r")[0]) == 10
    assert kv.get_group_block_ids("r")[1][:6] == [NULL_BLOCK_ID] * 6  # the last chunk started at 32: reads 25..


def finish(kv: GroupedKVCacheManager, request: Request) -> None:
    """Compute the whole request in one step, cache it and free it."""
    hit = kv.find_prefix_hit(request)
    assert kv.allocate_hit(request, request.num_tokens - hit.num_tokens, hit) is not None
    request.num_computed_tokens = request.num_tokens
    kv.cache_full_blocks(request)
    kv.free(request)


def test_a_hit_needs_the_whole_prefix_in_full_groups_and_the_window_in_sliding_ones():
    """After a 41-token request, the same prompt plus a token hits 40 tokens; the hit's sliding table is null before
    the window, and its cached blocks are the ones the window of position 40 reads (blocks 8 and 9)."""
    kv = GroupedKVCacheManager(64, BLOCK, (None, WINDOW), token_granular=False)
    finish(kv, Request("a", prompt(41)))
    hit = kv.find_prefix_hit(Request("b", prompt(41) + [7]))
    assert hit.num_tokens == 40
    full, sliding = hit.group_block_ids
    assert NULL_BLOCK_ID not in full and len(full) == 10
    assert sliding[:8] == (NULL_BLOCK_ID,) * 8 and NULL_BLOCK_ID not in sliding[8:]


def test_sliding_blocks_outside_the_window_may_be_evicted_and_the_hit_stays():
    """Evicting the sliding group's early blocks keeps the hit (right to left: only the window counts); evicting
    one inside the window shortens it to where a window is whole again; evicting a full group's block cuts there."""
    kv = GroupedKVCacheManager(64, BLOCK, (None, WINDOW), token_granular=False)
    finish(kv, Request("a", prompt(41)))
    request = Request("b", prompt(41) + [7])
    pool = kv.block_pool
    hashes = [request_block_hash(request, index, BLOCK) for index in range(10)]

    def evict(group: int, index: int) -> None:
        block = pool.get_cached_block(group_key(group, hashes[index]))
        assert block is not None
        pool._evict(block)  # as allocation would

    evict(1, 0)
    evict(1, 3)
    assert kv.find_prefix_hit(request).num_tokens == 40
    evict(1, 8)  # inside position 40's window: the longest hit whose window is whole ends at block 8 (32 tokens)
    assert kv.find_prefix_hit(request).num_tokens == 32
    evict(0, 5)  # the full group's chain ends at block 5; 20 tokens would read sliding block 3, evicted: 12
    assert kv.find_prefix_hit(request).num_tokens == 12  # 3 blocks: window of position 12 reads blocks 1-2


def test_groups_do_not_share_cache_entries_and_salts_do_not_cross():
    """The same tokens are cached once per group (keys differ); another cache_salt misses."""
    kv = GroupedKVCacheManager(64, BLOCK, (None, WINDOW), token_granular=False)
    finish(kv, Request("a", prompt(17)))
    assert kv.block_pool.num_cached_blocks == 8  # 4 full blocks in each of the 2 groups
    assert kv.find_prefix_hit(Request("b", prompt(17), cache_salt="other")).num_tokens == 0
    assert kv.find_prefix_hit(Request("c", prompt(17))).num_tokens == 16


def test_token_granular_hits_copy_the_partly_matching_block_in_every_group():
    """A finished 14-token request leaves a half-full tail: a prompt sharing 13 tokens hits 12 + 1 by copying the
    tail in each group (two copies queued, one per group)."""
    kv = GroupedKVCacheManager(64, BLOCK, (None, WINDOW))
    finish(kv, Request("a", prompt(14)))
    request = Request("b", prompt(13) + [5, 6])
    hit = kv.find_prefix_hit(request)
    assert hit.num_tokens == 13 and hit.num_copied_tokens == 1 and len(hit.group_copy_sources) == 2
    assert kv.allocate_hit(request, request.num_tokens - 13, hit) is not None
    copies = kv.take_block_copies()
    assert [source for source, _ in copies] == list(hit.group_copy_sources)
    assert [dest for _, dest in copies] == [table[3] for table in kv.get_group_block_ids("b")]


def test_allocation_counts_blocks_of_every_group():
    """A pool of 5 usable blocks: 12 tokens need 3 blocks in each of two groups, 6 > 5: refused, nothing held."""
    kv = GroupedKVCacheManager(6, BLOCK, (None, 100))
    request = Request("r", prompt(12))
    assert kv.allocate_slots(request, 12) is None
    assert kv.num_free_blocks == 5 and kv.get_group_block_ids("r") == ()


@pytest.mark.parametrize(("windows", "expected"), [
    ((None, 8, None, 8), [(None, (0, 2)), (8, (1, 3))]),
    ((8, 8, 8), [(8, (0, 1, 2))]),
    ((8, 8, None, 8, 8, 8), [(None, (2,)), (8, (0,)), (8, (1,)), (8, (3,)), (8, (4,)), (8, (5,))]),
    ((4, None, 4, 4, None), [(None, (1, 4)), (4, (0, 2)), (4, (3,))]),
])
def test_layers_group_by_kind_in_runs_of_the_smallest_kind(windows, expected):
    """Full layers first, then each window, in runs of the smallest kind's count (the last run may be short)."""
    assert layer_groups(windows) == expected


def shaped(num_layers: int, window: Optional[int], sliding: tuple[bool, ...]) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=64,
                       num_layers=num_layers, num_q_heads=16, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=10000.0, max_position_embeddings=32768, tie_word_embeddings=True,
                       sliding_window=window, layer_is_sliding=sliding)


def sequences_at_32k(model: ModelConfig, hybrid: bool, kv_bytes: int) -> int:
    """Sequences of 32k tokens the memory plan says fit in kv_bytes of 16-token blocks."""
    probe = plan_memory(model, 0, 2, 16, 32768, np.dtype("bfloat16"), 1, "interleaved", platform="cpu", hybrid=hybrid)
    num_blocks = kv_bytes // probe.kv_bytes_per_block_per_device
    return plan_memory(model, 0, num_blocks, 16, 32768, np.dtype("bfloat16"), 1, "interleaved", platform="cpu",
                       hybrid=hybrid).max_sequences_at_max_model_len


def test_gemma3_27b_and_gpt_oss_shapes_hold_more_sequences_at_32k():
    """In the same KV bytes: Gemma-3-27B's shape (62 layers, 5 local of window 1024 : 1 global) holds >= 5x the 32k
    sequences with groups; gpt-oss's (36 layers alternating window 128 and full) >= 1.9x."""
    gemma = shaped(62, 1024, tuple(index % 6 != 5 for index in range(62)))
    oss = shaped(36, 128, tuple(index % 2 == 0 for index in range(36)))
    kv_bytes = 200 * 2**30
    assert sequences_at_32k(gemma, True, kv_bytes) >= 5 * sequences_at_32k(gemma, False, kv_bytes)
    assert sequences_at_32k(oss, True, kv_bytes) >= 1.9 * sequences_at_32k(oss, False, kv_bytes)


@pytest.mark.parametrize("chunk", [1, 3, 8, 16])
def test_the_block_bound_holds_at_every_start_and_chunk(chunk):
    """sequence_blocks' sliding bound, ceil((w + C - 2) / block) + 1, is never exceeded, and is reached, over every
    start position of a C-token step (a hand-checked closed form against brute force)."""
    window = WINDOW
    most = 0
    for start in range(0, 80):
        first = sliding_blocks_skipped(start, window, BLOCK)
        held = -(-(start + chunk) // BLOCK) - first
        most = max(most, held)
    assert most == sequence_blocks(10_000, BLOCK, (window,), chunk)


def test_the_default_max_model_len_fits_every_group():
    """A pool of 40 usable blocks (4-token blocks, a full group beside a window-8 group, 16-token steps): the
    longest sequence needing at most 40 blocks is 33 full blocks + 7 sliding, 132 tokens."""
    assert max_sequence_tokens(40, BLOCK, (None, WINDOW), 16, 1000) == 132
    assert sequence_blocks(132, BLOCK, (None, WINDOW), 16) == 40 < sequence_blocks(133, BLOCK, (None, WINDOW), 16)
    assert fit_max_model_len(1000, 41, BLOCK, (None, WINDOW), 16) == 132
    assert fit_max_model_len(1000, 41, BLOCK) == 160  # one full group: every usable block
