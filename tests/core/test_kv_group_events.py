"""KV events under KV cache groups (core/kv_group_keys.py): each BlockStored / BlockRemoved names its chain hash and
its group (vLLM's group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window), and a subscriber that applies them
per (medium, group) always agrees with what the device pool and the tiers hold."""

import collections

from jaxpaged.core.hashing import request_block_hash
from jaxpaged.core.kv_cache_groups import GroupedKVCacheManager
from jaxpaged.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from jaxpaged.core.kv_group_keys import GroupedKVEventLog, group_key, split_group_key
from jaxpaged.core.request import Request
from jaxpaged.core.tier_events import TierEventRecorder
from jaxpaged.features.kv_events import named_fields
from tests.core.test_kv_cache_groups import BLOCK, WINDOW, prompt
from tests.core.test_kv_group_tiers import evict_everything, run
from tests.core.test_scheduler_stateful import FakeLowerTiers


class Subscriber:
    """What a router knows from the events: the chain hashes held per (medium, group)."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, int], set[bytes]] = collections.defaultdict(set)

    def apply(self, events: list[KVCacheEvent]) -> None:
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self.held.clear()
            elif isinstance(event, BlockStored):
                assert event.group_idx is not None
                for block_hash in event.block_hashes:
                    assert block_hash not in self.held[event.medium, event.group_idx]  # stored once until removed
                    self.held[event.medium, event.group_idx].add(block_hash)
            elif isinstance(event, BlockRemoved):
                assert event.group_idx is not None
                for block_hash in event.block_hashes:
                    self.held[event.medium, event.group_idx].remove(block_hash)  # KeyError: removed unannounced


def device_view(kv: GroupedKVCacheManager) -> dict[tuple[str, int], set[bytes]]:
    view: dict[tuple[str, int], set[bytes]] = collections.defaultdict(set)
    for _, key in kv.cached_blocks():
        chain_hash, group = split_group_key(key)
        assert group is not None
        view["GPU", group].add(chain_hash)
    return view


def test_stored_events_name_the_chain_hash_and_the_group():
    """A 9-token prompt stores blocks 0 and 1 in each group: the events carry the plain chain hashes (parent linked)
    with group 0 "full_attention" and group 1 "sliding_window" of window 8, as vLLM sends them."""
    kv = GroupedKVCacheManager(33, BLOCK, (None, WINDOW), token_granular=False)
    log = kv.record_kv_events()
    assert isinstance(log, GroupedKVEventLog)
    request = Request("a", prompt(9))
    run(kv, request, chunk=9)
    stored = [event for event in log.take() if isinstance(event, BlockStored)]
    hashes = [request_block_hash(request, index, BLOCK) for index in range(2)]
    assert [(e.group_idx, e.block_hashes, e.parent_block_hash) for e in stored] == [
        (0, (hashes[0],), None), (0, (hashes[1],), hashes[0]), (1, (hashes[0],), None), (1, (hashes[1],), hashes[0])]
    assert {(e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) for e in stored if e.group_idx == 0} == {
        ("full_attention", None)}
    assert {(e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) for e in stored if e.group_idx == 1} == {
        ("sliding_window", WINDOW)}
    fields = named_fields(stored[-1])
    assert list(fields)[-3:] == ["group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
    assert (fields["group_idx"], fields["kv_cache_spec_sliding_window"]) == (1, WINDOW)
    assert list(named_fields(stored[0]))[-2:] == ["group_idx", "kv_cache_spec_kind"]  # no window: omitted


def test_removed_events_name_the_group_of_the_evicted_block():
    """Evicting one group's block announces its chain hash under that group only."""
    kv = GroupedKVCacheManager(33, BLOCK, (None, WINDOW), token_granular=False)
    log = kv.record_kv_events()
    request = Request("a", prompt(9))
    run(kv, request, chunk=9)
    log.take()
    block = kv.block_pool.get_cached_block(group_key(1, request_block_hash(request, 0, BLOCK)))
    assert block is not None
    filler = Request("filler", prompt(64, start=900))  # 16 blocks a group: every free block, evicting all four
    assert kv.allocate_slots(filler, filler.num_tokens) is not None
    removed = [event for event in log.take() if isinstance(event, BlockRemoved)]
    assert len(removed) == 4 and {(e.group_idx, e.block_hashes[0]) for e in removed} == {
        (group, request_block_hash(request, index, BLOCK)) for group in (0, 1) for index in (0, 1)}
    assert named_fields(removed[0])["group_idx"] in (0, 1)


def test_a_subscribers_view_per_group_matches_the_device_and_the_tier():
    """Several prompts through a small pool with a host tier: applying every event per (medium, group), each
    removal was announced before, and the view equals what the device pool caches and what the tier holds, group
    by group."""
    tiers = FakeLowerTiers(1000, damaging=False)
    kv = GroupedKVCacheManager(33, BLOCK, (None, WINDOW), token_granular=False, lower_tiers=tiers)
    kv.min_load_blocks = 1
    log = kv.record_kv_events()
    recorder = TierEventRecorder([log])
    kv.record_tier_events(recorder)
    subscriber = Subscriber()
    for round_index, start in enumerate((100, 300, 100, 500, 300)):
        run(kv, Request(f"r{round_index}", prompt(41, start=start)), chunk=8)
        for _, key in evict_everything(kv, tiers):
            recorder.stored("CPU", key)
        recorder.flush()
        subscriber.apply(log.take())
        assert {k: v for k, v in subscriber.held.items() if k[0] == "GPU" and v} == {
            k: v for k, v in device_view(kv).items() if v}
        below: dict[tuple[str, int], set[bytes]] = collections.defaultdict(set)
        for key in tiers.blocks:
            chain_hash, group = split_group_key(key)
            assert group is not None
            below["CPU", group].add(chain_hash)
        assert {k: v for k, v in subscriber.held.items() if k[0] == "CPU"} == below
