"""The prefix cache over lower KV tiers, hand-worked on 4-token blocks: what the device evicts is saved once, a chain
goes on below the device, short tier hits are recomputed, and a damaged entry ends the hit (and its copy)."""

from typing import Optional

from jaxpaged.config import CacheConfig, SchedulerConfig
from jaxpaged.core import Request, Scheduler, SchedulerOutput
from jaxpaged.core.hashing import hash_block_tokens
from tests.core.test_scheduler_stateful import FakeLowerTiers


def build(tiers: FakeLowerTiers, num_kv_blocks: int = 7) -> Scheduler:
    """6 usable blocks of 4 tokens: one 17-token prompt (5 blocks) at a time."""
    config = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=32)
    return Scheduler(config, CacheConfig(block_size=4), num_kv_blocks, lower_tiers=tiers)


def serve(scheduler: Scheduler, tiers: FakeLowerTiers, request: Request) -> SchedulerOutput:
    """Run the request to its end (one output token); every step's saves go into the tier. Returns its first step."""
    scheduler.add_request(request)
    first: Optional[SchedulerOutput] = None
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        first = first or output
        for block_id, block_hash in output.kv_saves:
            tiers.store(block_hash, ("block", block_id))
        scheduler.update_from_output(output, [7] * output.num_sampled_requests)
    assert first is not None
    return first


def chain(tokens: list[int], num_blocks: int) -> list[bytes]:
    hashes, parent = [], None
    for index in range(num_blocks):
        parent = hash_block_tokens(parent, tokens[index * 4:(index + 1) * 4])
        hashes.append(parent)
    return hashes


A = list(range(100, 117))  # 17 tokens: 4 full blocks are hittable
B = list(range(200, 217))


def test_evicted_blocks_are_saved_once_and_a_chain_continues_below_the_device():
    tiers = FakeLowerTiers(100, damaging=False)
    scheduler = build(tiers)
    serve(scheduler, tiers, Request("a", A, max_tokens=1))
    first_b = serve(scheduler, tiers, Request("b", B, max_tokens=1))  # needs 5 blocks: evicts a's tail
    saved = [block_hash for _, block_hash in first_b.kv_saves]
    assert saved and set(saved) <= set(chain(A, 4)) and len(set(saved)) == len(saved)
    again = scheduler.kv_cache_manager.find_prefix_hit(Request("a2", A))
    assert again.num_tokens == 16 and again.num_blocks == 4 and again.lower_tier_hashes == tuple(saved[::-1])
    first_a2 = serve(scheduler, tiers, Request("a2", A, max_tokens=1))
    assert [payload for _, payload in first_a2.kv_loads] == [tiers.blocks[h] for h in saved[::-1]]
    assert first_a2.scheduled[0].start_position == 16  # only the last token is computed
    # b's blocks, evicted now, go down; a's blocks that the tier already holds are not copied again.
    first_b2 = serve(scheduler, tiers, Request("b2", B, max_tokens=1))
    assert not set(h for _, h in first_b2.kv_saves) & set(chain(A, 4))


def test_hits_shorter_than_min_load_blocks_are_recomputed():
    tiers = FakeLowerTiers(100, damaging=False)
    scheduler = build(tiers)
    serve(scheduler, tiers, Request("a", A, max_tokens=1))
    serve(scheduler, tiers, Request("b", B, max_tokens=1))
    probe = Request("probe", A)
    num_below = len(scheduler.kv_cache_manager.find_prefix_hit(probe).lower_tier_hashes)
    scheduler.kv_cache_manager.min_load_blocks = num_below + 1
    hit = scheduler.kv_cache_manager.find_prefix_hit(probe)
    assert hit.lower_tier_hashes == () and hit.num_tokens == len(hit.block_ids) * 4


def test_a_damaged_entry_ends_the_hit_and_cancels_the_copy_after_it():
    """A's 4 full blocks only in the tier, and a block of the device listed after them holding A's 17th token and
    more (copy source); the third fetch fails."""
    tiers = FakeLowerTiers(100, damaging=False)
    scheduler = build(tiers)
    manager = scheduler.kv_cache_manager
    hashes = chain(A, 4)
    for block_hash in hashes:
        tiers.store(block_hash, ("block", block_hash))
    (source,) = manager.block_pool.get_new_blocks(1)
    manager.block_pool.cache_partial_block(source, hashes[-1], (116, 5, 6))
    manager.block_pool.free_blocks([source])
    request = Request("a", A + [5, 9], max_tokens=1)
    hit = manager.find_prefix_hit(request)
    assert hit.lower_tier_hashes == tuple(hashes) and hit.copy_source == source.block_id and hit.num_tokens == 18
    tiers.damaging = True  # the 3rd fetch fails
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert [payload for _, payload in output.kv_loads] == [("block", hashes[0]), ("block", hashes[1])]
    assert output.scheduled[0].start_position == 8 and output.block_copies == []
    assert source.ref_cnt == 0  # the copy's source is released again
    assert hashes[2] not in tiers.blocks  # the damaged entry is gone
    scheduler.update_from_output(output, [7])
    assert manager.find_prefix_hit(Request("again", A + [5, 9])).num_blocks == 4  # all on the device now


def test_blocks_evicted_to_make_room_for_loads_are_saved():
    """Issue 43 item 14: a's second visit loads a's blocks from the tier into the very blocks it evicts from b;
    b's K/V is still in them when the step's saves gather it (dispatched before the loads), so b goes down too
    and hits in full on its own second visit."""
    tiers = FakeLowerTiers(100, damaging=False)
    scheduler = build(tiers)
    serve(scheduler, tiers, Request("a", A, max_tokens=1))
    serve(scheduler, tiers, Request("b", B, max_tokens=1))
    first_a2 = serve(scheduler, tiers, Request("a2", A, max_tokens=1))
    load_destinations = {block_id for block_id, _ in first_a2.kv_loads}
    saved_into_loads = {block_hash for block_id, block_hash in first_a2.kv_saves if block_id in load_destinations}
    assert saved_into_loads and saved_into_loads <= set(chain(B, 4))
    hit = scheduler.kv_cache_manager.find_prefix_hit(Request("b2", B))
    assert hit.num_tokens == 16 and len(hit.lower_tier_hashes) + len(hit.block_ids) == 4


def test_a_block_loaded_and_evicted_in_one_step_is_not_saved():
    """A block whose load is still pending holds nothing on the device yet: if it is evicted before the step runs,
    the tier keeps it (touched), and no save gathers the block's stale contents under the loaded hash."""
    tiers = FakeLowerTiers(100, damaging=False)
    scheduler = build(tiers)
    manager = scheduler.kv_cache_manager
    hashes = chain(A, 4)
    for block_hash in hashes:
        tiers.store(block_hash, ("block", block_hash))
    request = Request("a", A, max_tokens=1)
    hit = manager.find_prefix_hit(request)
    assert manager.allocate_slots(request, 1, hit.block_ids, num_loaded_blocks=len(hit.lower_tier_hashes))
    assert manager.load_lower_tier_blocks(request, hit) == 16
    manager.free(request, tail_is_computed=False)  # preempted before its step ran
    tiers.blocks.clear()  # and the tier dropped them since (a bounded host tier without a disk)
    other = Request("b", B, max_tokens=1)
    assert manager.allocate_slots(other, len(B))  # takes the blocks just loaded, evicting their hashes
    saves, loads = manager.take_tier_transfers()
    assert len(loads) == 4 and not {block_hash for _, block_hash in saves} & set(hashes)
