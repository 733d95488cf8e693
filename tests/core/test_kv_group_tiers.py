"""The KV tiers under KV cache groups (core/kv_cache_groups.py, kv_group_tiers.py), hand-worked on 4-token blocks, a
full group and a sliding group of window 8: evicted blocks go down under their group's key, a tier hit follows the
groups' rule and each group's blocks come back from its own entries, the sliding blocks the window left behind are
not offloaded, and a missing entry leaves the device's hit."""

from typing import Optional

from jaxpaged.core.block_pool import NULL_BLOCK_ID
from jaxpaged.core.hashing import request_block_hash
from jaxpaged.core.kv_cache_groups import GroupedKVCacheManager, group_key
from jaxpaged.core.kv_group_keys import split_group_key
from jaxpaged.core.request import Request
from tests.core.test_kv_cache_groups import BLOCK, WINDOW, prompt
from tests.core.test_scheduler_stateful import FakeLowerTiers

FULL, SLIDING = 0, 1


class LosingTiers(FakeLowerTiers):
    """A fake tier whose entries may disappear between a lookup and the read (fetch: None)."""

    def fetch(self, block_hash: bytes) -> Optional[object]:
        return super().fetch(block_hash) if block_hash in self.blocks else None


def build(tiers: FakeLowerTiers, num_kv_blocks: int = 33) -> GroupedKVCacheManager:
    kv = GroupedKVCacheManager(num_kv_blocks, BLOCK, (None, WINDOW), token_granular=False, lower_tiers=tiers)
    kv.min_load_blocks = 1
    return kv


def run(kv: GroupedKVCacheManager, request: Request, chunk: int, num_tokens: Optional[int] = None) -> None:
    """Compute the request's first num_tokens tokens (all of them by default) in chunks, caching as the scheduler
    does after each step, then free it."""
    num_tokens = request.num_tokens if num_tokens is None else num_tokens
    while request.num_computed_tokens < num_tokens:
        step = min(chunk, num_tokens - request.num_computed_tokens)
        assert kv.allocate_slots(request, step) is not None
        request.num_computed_tokens += step
        kv.cache_full_blocks(request)
    kv.free(request)


def evict_everything(kv: GroupedKVCacheManager, tiers: FakeLowerTiers) -> list[tuple[int, bytes]]:
    """Allocate every free block to an unrelated request (evicting what is cached), store the saves in the tier as
    ("block", block id) and free the filler; the saves."""
    filler = Request("filler", prompt(BLOCK * (kv.num_free_blocks // 2), start=5000))
    assert kv.allocate_slots(filler, filler.num_tokens) is not None
    saves, _ = kv.take_tier_transfers()
    for block_id, key in saves:
        tiers.store(key, ("block", block_id))
    kv.trim_blocks(filler)  # nothing computed: the blocks go back unwritten
    kv.free(filler)
    return saves


def keys_of(tokens: list[int], group: int, indices) -> set[bytes]:
    request = Request("keys", tokens)
    return {group_key(group, request_block_hash(request, index, BLOCK)) for index in indices}


def test_a_tier_hit_loads_each_group_from_its_own_entries():
    """A 41-token prompt computed in one step, evicted to the tier: the same prompt plus a token hits 40 tokens from
    it, all 10 full-group blocks and only the sliding group's window (blocks 8 and 9); each destination block gets
    the payload saved from that group's block, never the other group's."""
    tiers = FakeLowerTiers(1000, damaging=False)
    kv = build(tiers)
    run(kv, Request("a", prompt(41)), chunk=41)
    saves = evict_everything(kv, tiers)
    assert {split_group_key(key)[1] for _, key in saves} == {FULL, SLIDING}
    request = Request("b", prompt(41) + [7])
    hit = kv.find_prefix_hit(request)
    assert hit.num_tokens == 40
    assert hit.group_loads == tuple((FULL, index) for index in range(10)) + ((SLIDING, 8), (SLIDING, 9))
    assert kv.allocate_hit(request, 2, hit) is not None
    assert kv.load_lower_tier_blocks(request, hit) == 40
    _, loads = kv.take_tier_transfers()
    full, sliding = kv.get_group_block_ids("b")
    assert sliding[:8] == [NULL_BLOCK_ID] * 8
    destinations = [(FULL, index, full[index]) for index in range(10)] + [(SLIDING, 8, sliding[8]),
                                                                           (SLIDING, 9, sliding[9])]
    saved = {key: block_id for block_id, key in saves}
    expected = [(block_id, ("block", saved[group_key(group, request_block_hash(request, index, BLOCK))]))
                for group, index, block_id in destinations]
    assert loads == expected
    assert kv.find_prefix_hit(Request("c", prompt(41) + [9])).group_loads == ()  # loaded blocks hit on the device


def test_one_groups_entries_never_serve_another():
    """With only the full group's entries in the tier, the sliding group has nothing below the device: no tier hit
    (the same chain hash under the full group's key is not the sliding group's K/V)."""
    tiers = FakeLowerTiers(1000, damaging=False)
    kv = build(tiers)
    run(kv, Request("a", prompt(41)), chunk=41)
    evict_everything(kv, tiers)
    for key in [key for key in tiers.blocks if split_group_key(key)[1] == SLIDING]:
        del tiers.blocks[key]
    hit = kv.find_prefix_hit(Request("b", prompt(41) + [7]))
    assert hit.num_tokens == 0 and hit.group_loads == ()


def test_sliding_blocks_the_window_left_behind_are_not_offloaded():
    """A 41-token prompt in 8-token chunks: the sliding group gives back blocks 0-7 as its window passes them; the
    window of the prompt's end (position 40) reads blocks 8-9, so only those of the sliding group go down, with all
    of the full group's, and the tier hit of the same prompt is whole."""
    tiers = FakeLowerTiers(1000, damaging=False)
    kv = build(tiers)
    tokens = prompt(41)
    run(kv, Request("a", tokens), chunk=8)
    saved = {key for _, key in evict_everything(kv, tiers)}
    assert saved & keys_of(tokens, SLIDING, range(10)) == keys_of(tokens, SLIDING, (8, 9))
    assert keys_of(tokens, FULL, range(10)) <= saved
    assert kv.find_prefix_hit(Request("b", tokens + [7])).num_tokens == 40


def test_blocks_in_the_prompts_last_window_go_down_even_after_decoding_past_them():
    """A 41-token prompt that decodes to 60 tokens gives back sliding blocks 0-12: of those only 8-9, in the window
    of the prompt's end, are offloaded (a repeated prompt hits them), not the generated 10-12; the blocks the request
    held at its end (13-14, where a continued chat hits) go down as well."""
    tiers = FakeLowerTiers(1000, damaging=False)
    kv = build(tiers)
    tokens = prompt(41)
    request = Request("a", tokens, max_tokens=40)
    assert kv.allocate_slots(request, 41) is not None
    request.num_computed_tokens = 41
    kv.cache_full_blocks(request)
    for token in range(19):  # decode one token at a time
        request.append_output_token(1000 + token)
        assert kv.allocate_slots(request, 1) is not None
        request.num_computed_tokens += 1
        kv.cache_full_blocks(request)
    kv.free(request)
    saved = {key for _, key in evict_everything(kv, tiers)}
    sliding = saved & keys_of(request.all_token_ids, SLIDING, range(15))
    assert sliding == keys_of(request.all_token_ids, SLIDING, (8, 9, 13, 14))
    assert kv.find_prefix_hit(Request("b", tokens + [7])).num_tokens == 40


def test_a_missing_tier_entry_leaves_the_devices_hit_up_to_the_same_end():
    """When a tier block is gone by the time it is read, the allocation falls back to the device's hit (none here)
    and still covers the hit's tokens plus the new ones, and no load is queued."""
    tiers = LosingTiers(1000, damaging=False)
    kv = build(tiers, num_kv_blocks=41)
    run(kv, Request("a", prompt(41)), chunk=41)
    evict_everything(kv, tiers)
    request = Request("b", prompt(41) + [7])
    hit = kv.find_prefix_hit(request)
    assert hit.num_tokens == 40
    del tiers.blocks[hit.lower_tier_hashes[3]]  # gone between the lookup and the read
    assert kv.allocate_hit(request, 2, hit) is not None
    assert kv.load_lower_tier_blocks(request, hit) == 0
    assert kv.take_tier_transfers()[1] == []
    full, sliding = kv.get_group_block_ids("b")
    assert len(full) == len(sliding) == 11 and NULL_BLOCK_ID not in full + sliding
