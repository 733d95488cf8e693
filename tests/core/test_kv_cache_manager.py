"""KVCacheManager: prefix lookups (vLLM V1 semantics), slot allocation, caching of computed blocks, free order."""

import pytest

from jaxpaged.core import KVCacheManager, Request
from tests.core.core_helpers import make_request


def compute(manager: KVCacheManager, request: Request, num_new_tokens: int, hit_block_ids=(), num_hit_tokens=0):
    """Allocate like the scheduler, mark the tokens computed and cache the full blocks, like one step."""
    new_block_ids = manager.allocate_slots(request, num_new_tokens, hit_block_ids)
    assert new_block_ids is not None
    request.num_computed_tokens += num_hit_tokens + num_new_tokens
    manager.cache_full_blocks(request)
    return new_block_ids


def admit(manager: KVCacheManager, request: Request):
    """Look up the prefix cache and compute the rest of the request's tokens."""
    hit_block_ids, num_hit_tokens = manager.get_computed_blocks(request)
    compute(manager, request, request.num_tokens - num_hit_tokens, hit_block_ids, num_hit_tokens)
    return hit_block_ids, num_hit_tokens


def ref_counts(manager: KVCacheManager) -> list[int]:
    return [block.ref_cnt for block in manager.block_pool.blocks]


def test_shared_1000_token_prefix_gives_992_cached_tokens():
    """vLLM V1's figure: 16-token blocks, a 1,000-token shared prefix, then a different question."""
    manager = KVCacheManager(num_kv_blocks=200, block_size=16)
    prefix = list(range(1000))
    admit(manager, Request("first", prefix + [5001, 5002, 5003]))
    second = Request("second", prefix + [6001, 6002, 6003, 6004])
    hit_block_ids, num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 992 and len(hit_block_ids) == 62
    assert hit_block_ids == manager.get_block_ids("first")[:62]


def test_difference_at_token_zero_gives_no_hit():
    manager = KVCacheManager(num_kv_blocks=200, block_size=16)
    admit(manager, Request("first", list(range(1000))))
    assert manager.get_computed_blocks(Request("second", [-1] + list(range(1, 1000)))) == ([], 0)


def test_different_cache_salt_never_shares_a_block():
    manager = KVCacheManager(num_kv_blocks=200, block_size=16)
    tokens = list(range(100))
    admit(manager, Request("first", tokens, cache_salt="tenant-a"))
    assert manager.get_computed_blocks(Request("other-salt", tokens, cache_salt="tenant-b")) == ([], 0)
    assert manager.get_computed_blocks(Request("no-salt", tokens)) == ([], 0)
    assert manager.get_computed_blocks(Request("same-salt", tokens, cache_salt="tenant-a"))[1] == 96


@pytest.mark.parametrize("num_prompt_tokens, expected_hit_tokens", [
    (1, 0), (3, 0), (4, 0), (5, 4), (8, 4), (9, 8), (12, 8), (13, 12), (40, 36), (41, 40)])
def test_hit_never_covers_the_whole_prompt(num_prompt_tokens, expected_hit_tokens):
    """At least one prompt token is always computed, so its logits exist: a full-prompt match hits one block less."""
    manager = KVCacheManager(num_kv_blocks=64, block_size=4)
    tokens = list(range(num_prompt_tokens))
    admit(manager, Request("first", tokens))
    assert manager.get_computed_blocks(Request("second", tokens))[1] == expected_hit_tokens


def test_partial_block_is_never_cached():
    manager = KVCacheManager(num_kv_blocks=64, block_size=4)
    admit(manager, Request("first", list(range(7))))  # one full block and 3 tokens
    assert manager.get_computed_blocks(Request("second", list(range(7)) + [50, 51]))[1] == 4


def test_blocks_become_hittable_only_once_computed_and_chunk_by_chunk():
    manager = KVCacheManager(num_kv_blocks=64, block_size=4)
    tokens = list(range(20))
    first = Request("first", tokens)
    assert manager.allocate_slots(first, 6) == [1, 2]
    first.num_computed_tokens = 6
    assert manager.get_computed_blocks(Request("probe-0", tokens))[1] == 0  # not cached before the step ran
    manager.cache_full_blocks(first)
    assert manager.get_computed_blocks(Request("probe-1", tokens))[1] == 4
    compute(manager, first, 10)
    assert manager.get_computed_blocks(Request("probe-2", tokens))[1] == 16


def test_blocks_filled_by_generated_tokens_are_hittable():
    manager = KVCacheManager(num_kv_blocks=64, block_size=4)
    request = Request("gen", [1, 2, 3])
    admit(manager, request)
    for token in (4, 5, 6, 7, 8):  # decode: each appended token is computed in the next step
        request.append_output_token(token)
        compute(manager, request, 1)
    assert request.num_computed_tokens == 8
    assert manager.get_computed_blocks(Request("follow-up", [1, 2, 3, 4, 5, 6, 7, 8, 9]))[1] == 8


def test_allocate_slots_returns_only_new_blocks_and_grows_at_block_boundaries():
    manager = KVCacheManager(num_kv_blocks=16, block_size=4)
    request = make_request("a", 4)
    assert manager.allocate_slots(request, 4) == [1]
    request.num_computed_tokens = 4
    request.append_output_token(9)
    assert manager.allocate_slots(request, 1) == [2]
    request.num_computed_tokens = 5
    request.append_output_token(9)
    assert manager.allocate_slots(request, 1) == []
    assert manager.get_block_ids("a") == [1, 2]


@pytest.mark.parametrize("num_tokens, expected_num_blocks", [(1, 1), (3, 1), (4, 1), (5, 2), (33, 9)])
def test_allocation_covers_edge_lengths(num_tokens, expected_num_blocks):
    manager = KVCacheManager(num_kv_blocks=16, block_size=4)
    block_ids = manager.allocate_slots(make_request("a", num_tokens), num_tokens)
    assert block_ids is not None and len(block_ids) == expected_num_blocks


def test_failed_allocation_changes_nothing():
    """With hit blocks that sit in the free queue, a too-large request is refused and no ref count moves."""
    manager = KVCacheManager(num_kv_blocks=5, block_size=4)  # 4 usable blocks
    first = Request("first", list(range(12)))
    admit(manager, first)
    manager.free(first)
    free_before, refs_before = manager.block_pool.free_block_ids(), ref_counts(manager)
    assert free_before == [4, 3, 2, 1]
    second = Request("second", list(range(8)) + list(range(100, 112)))  # 20 tokens: 2 hit + 3 new blocks
    hit_block_ids, num_hit_tokens = manager.get_computed_blocks(second)
    assert hit_block_ids == [1, 2] and num_hit_tokens == 8
    assert manager.allocate_slots(second, 12, hit_block_ids) is None
    assert manager.block_pool.free_block_ids() == free_before and ref_counts(manager) == refs_before
    assert manager.get_block_ids("second") == []
    # One block less fits exactly: the two hit blocks are reused, two new ones taken from the head.
    assert manager.allocate_slots(second, 8, hit_block_ids) == [4, 3]
    assert manager.get_block_ids("second") == [1, 2, 4, 3] and manager.num_free_blocks == 0


def test_failed_growth_keeps_the_block_table():
    manager = KVCacheManager(num_kv_blocks=3, block_size=4)
    request = make_request("a", 8)
    assert manager.allocate_slots(request, 8) == [1, 2]
    request.num_computed_tokens = 8
    assert manager.allocate_slots(request, 1) is None
    assert manager.get_block_ids("a") == [1, 2] and ref_counts(manager) == [0, 1, 1]


def test_free_appends_blocks_tail_first_so_chains_are_evicted_from_their_end():
    manager = KVCacheManager(num_kv_blocks=6, block_size=4)
    first = Request("first", list(range(12)))
    admit(manager, first)
    assert manager.get_block_ids("first") == [1, 2, 3]
    manager.free(first)
    assert manager.block_pool.free_block_ids() == [4, 5, 3, 2, 1]
    other = Request("other", list(range(100, 112)))
    admit(manager, other)  # takes 4, 5 and evicts 3, the end of first's chain
    assert manager.get_block_ids("other") == [4, 5, 3]
    longer = Request("longer", list(range(12)) + [50, 51, 52, 53])
    assert manager.get_computed_blocks(longer) == ([1, 2], 8)


def test_shared_hit_blocks_are_reference_counted():
    manager = KVCacheManager(num_kv_blocks=16, block_size=4)
    tokens = list(range(9))
    first, second = Request("first", tokens), Request("second", tokens)
    admit(manager, first)
    assert admit(manager, second) == ([1, 2], 8)
    assert ref_counts(manager)[1:4] == [2, 2, 1]
    manager.free(first)
    assert ref_counts(manager)[1:5] == [1, 1, 0, 1]
    assert manager.block_pool.free_block_ids()[-1] == 3


def test_prefix_caching_disabled_never_hits():
    manager = KVCacheManager(num_kv_blocks=64, block_size=4, enable_prefix_caching=False)
    tokens = list(range(20))
    admit(manager, Request("first", tokens))
    assert manager.get_computed_blocks(Request("second", tokens)) == ([], 0)
    manager.record_prefix_lookup(20, 0)
    assert (manager.prefix_cache_queries, manager.prefix_cache_hits) == (0, 0)


def test_reset_prefix_cache_refused_while_blocks_are_held():
    manager = KVCacheManager(num_kv_blocks=16, block_size=4)
    tokens = list(range(9))
    first = Request("first", tokens)
    admit(manager, first)
    assert manager.reset_prefix_cache() is False
    manager.free(first)
    assert manager.usage == 0.0
    assert manager.reset_prefix_cache() is True
    assert manager.get_computed_blocks(Request("second", tokens)) == ([], 0)
