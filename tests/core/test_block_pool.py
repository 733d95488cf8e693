"""BlockPool: the null block, allocation order, the free queue's LRU order, ref counts and cached hashes."""

import pytest

from jaxpaged.core import NULL_BLOCK_ID, BlockPool


def ids(blocks) -> list[int]:
    return [block.block_id for block in blocks]


def test_null_block_is_never_handed_out():
    """Block 0 is outside the free queue: allocating every free block yields 1..n-1, then nothing."""
    pool = BlockPool(5)
    assert pool.free_block_ids() == [1, 2, 3, 4]
    assert ids(pool.get_new_blocks(4)) == [1, 2, 3, 4]
    assert NULL_BLOCK_ID == 0 and pool.null_block.block_id == 0
    with pytest.raises(ValueError, match="num_blocks"):
        pool.get_new_blocks(1)


@pytest.mark.parametrize("num_blocks", [0, 1, 2.0, None])
def test_pool_needs_a_real_block_besides_the_null_block(num_blocks):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(num_blocks)


def test_allocation_pops_from_the_head_with_ref_count_one():
    pool = BlockPool(6)
    first, second = pool.get_new_blocks(2), pool.get_new_blocks(3)
    assert ids(first) == [1, 2] and ids(second) == [3, 4, 5]
    assert all(block.ref_cnt == 1 for block in first + second)
    assert pool.num_free_blocks == 0 and pool.usage == 1.0


def test_freed_blocks_join_the_tail_in_the_given_order():
    """The free queue is least recently freed first; freeing order decides eviction order."""
    pool = BlockPool(7)
    blocks = pool.get_new_blocks(4)  # 1, 2, 3, 4; 5 and 6 stay free
    pool.free_blocks([blocks[1], blocks[0]])
    assert pool.free_block_ids() == [5, 6, 2, 1]
    pool.free_blocks([blocks[3]])
    assert pool.free_block_ids() == [5, 6, 2, 1, 4]
    assert ids(pool.get_new_blocks(3)) == [5, 6, 2]


def test_shared_block_is_free_only_when_its_last_holder_frees_it():
    pool = BlockPool(3)
    block, = pool.get_new_blocks(1)
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and pool.free_block_ids() == [2]
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and pool.free_block_ids() == [2, 1]
    with pytest.raises(ValueError, match="freed more often"):
        pool.free_blocks([block])


def test_touching_a_free_cached_block_takes_it_out_of_the_middle_of_the_queue():
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(4)
    pool.cache_block(blocks[1], b"h2")
    pool.free_blocks(blocks)
    assert pool.free_block_ids() == [1, 2, 3, 4]
    hit = pool.get_cached_block(b"h2")
    assert hit is not None and hit is blocks[1]
    pool.touch([hit])
    assert hit.ref_cnt == 1 and pool.free_block_ids() == [1, 3, 4]
    assert ids(pool.get_new_blocks(3)) == [1, 3, 4]


def test_freed_block_keeps_its_hash_until_reallocation_evicts_it():
    pool = BlockPool(3)
    first, second = pool.get_new_blocks(2)
    pool.cache_block(first, b"a")
    pool.cache_block(second, b"b")
    pool.free_blocks([second, first])  # eviction order: second, then first
    assert pool.get_cached_block(b"a") is first and pool.get_cached_block(b"b") is second
    assert ids(pool.get_new_blocks(1)) == [2]
    assert pool.get_cached_block(b"b") is None and second.block_hash is None
    assert pool.get_cached_block(b"a") is first


def test_a_hash_keeps_its_first_block_and_a_cached_block_keeps_its_hash():
    pool = BlockPool(4)
    first, second, third = pool.get_new_blocks(3)
    pool.cache_block(first, b"same")
    pool.cache_block(second, b"same")
    pool.cache_block(first, b"other")
    assert pool.get_cached_block(b"same") is first and second.block_hash is None
    assert pool.get_cached_block(b"other") is None and pool.num_cached_blocks == 1


def test_caching_disabled_registers_nothing():
    pool = BlockPool(3, enable_caching=False)
    block, = pool.get_new_blocks(1)
    pool.cache_block(block, b"x")
    assert pool.get_cached_block(b"x") is None and block.block_hash is None


def test_reset_prefix_cache_only_when_no_block_is_in_use():
    pool = BlockPool(4)
    first, second = pool.get_new_blocks(2)
    pool.cache_block(first, b"a")
    pool.free_blocks([first])
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(b"a") is first
    pool.free_blocks([second])
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(b"a") is None and first.block_hash is None and pool.num_cached_blocks == 0


def test_usage_counts_held_blocks_over_usable_blocks():
    pool = BlockPool(5)
    assert pool.usage == 0.0
    blocks = pool.get_new_blocks(3)
    assert pool.usage == pytest.approx(0.75)
    pool.free_blocks(blocks)
    assert pool.usage == 0.0
