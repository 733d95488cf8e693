"""KV events of the tiers below the device: a subscriber that applies them (vLLM's wire format) rebuilds exactly
what host memory ("CPU") and disk ("DISK") hold, as the tiers' own listings say, through spills from host to disk,
LRU evictions, a promotion from disk, a damaged file, a reset (the disk survives it) and a restart (the disk's files
are announced, without tokens). End to end, the same through an engine whose device evicts to the tiers and loads
back from them."""

import json
import time
import uuid

import numpy as np
import pytest

from jaxpaged.core.hashing import hash_block_tokens
from jaxpaged.core.kv_events import KVEventLog
from jaxpaged.core.tier_events import BlockRecord, TierEventRecorder
from jaxpaged.features.kv_events import named_fields
from jaxpaged.kv_tiers import KVTiers

pytest.importorskip("zmq")
pytest.importorskip("msgpack")
from tests.engine.kv_events_subscriber import Subscriber  # noqa: E402 (needs zmq)

pytestmark = pytest.mark.xdist_group("kv_tiers")

BLOCK_SIZE = 4
PAYLOAD = np.zeros((2, 8), np.float32)  # 64 bytes a block
FINGERPRINT = "f" * 32


def chain(num_blocks: int, first_token: int) -> list[tuple[bytes, BlockRecord]]:
    """(chain hash, event record) of each block of a prompt of consecutive tokens."""
    blocks, parent = [], None
    for index in range(num_blocks):
        tokens = tuple(range(first_token + index * BLOCK_SIZE, first_token + (index + 1) * BLOCK_SIZE))
        block_hash = hash_block_tokens(parent, tokens)
        blocks.append((block_hash, BlockRecord(parent, tokens)))
        parent = block_hash
    return blocks


class Watcher:
    """A tier with KV events recorded into one log, and a subscriber fed from that log."""

    def __init__(self, directory) -> None:
        # Host memory for 2 blocks; disk for 3 files (each a signed header of about 270 bytes and the payload).
        self.tiers = KVTiers([FINGERPRINT], host_bytes=2 * PAYLOAD.nbytes, disk_directory=str(directory),
                             disk_bytes=1100)
        self.log = KVEventLog(BLOCK_SIZE)
        self.recorder = TierEventRecorder([self.log])
        self.subscriber = Subscriber(f"inproc://unused-{uuid.uuid4().hex}", "", BLOCK_SIZE)
        self.tiers.record_events(self.recorder)

    def store(self, blocks: list[tuple[bytes, BlockRecord]]) -> None:
        for block_hash, record in blocks:
            self.recorder.remember(block_hash, record)  # as the KV cache manager does when the pool evicts it
            self.tiers.store(block_hash, [PAYLOAD])

    def rebuilt_equals_tiers(self) -> bool:
        self.recorder.flush()
        for event in self.log.take():
            self.subscriber.apply(0, named_fields(event))
        held = self.tiers.held_hashes()
        rebuilt = {medium: self.subscriber.held[medium].get(0, set()) for medium in held}
        return rebuilt == held


def test_rebuilt_tiers_follow_spills_evictions_promotion_damage_reset_and_restart(tmp_path):
    watcher = Watcher(tmp_path)
    blocks = chain(6, first_token=10)
    watcher.store(blocks)
    held = watcher.tiers.held_hashes()
    assert held["CPU"] == {blocks[4][0], blocks[5][0]} and len(held["DISK"]) == 3  # disk evicted blocks[0]
    assert watcher.rebuilt_equals_tiers()
    counts = watcher.subscriber.counts_by_medium
    assert counts["BlockRemoved", "CPU"] == 4 and counts["BlockRemoved", "DISK"] == 1

    assert watcher.tiers.fetch(blocks[1][0]) is not None  # from disk, promoted to host (which spills one down)
    assert blocks[1][0] in watcher.tiers.held_hashes()["CPU"]
    assert watcher.rebuilt_equals_tiers()

    held = watcher.tiers.held_hashes()
    damaged = next(block_hash for block_hash, _ in blocks if block_hash in held["DISK"] - held["CPU"])
    path = tmp_path / FINGERPRINT / damaged.hex()[:2] / (damaged.hex() + ".kv")
    path.write_bytes(path.read_bytes()[:-1])
    assert watcher.tiers.fetch(damaged) is None
    assert damaged not in watcher.tiers.held_hashes()["DISK"]
    assert watcher.rebuilt_equals_tiers()

    watcher.tiers.clear_host()
    watcher.log.cleared()  # the device pool's reset, which follows the tiers' in the engine
    disk = watcher.tiers.held_hashes()["DISK"]
    assert watcher.rebuilt_equals_tiers()
    assert watcher.subscriber.held["CPU"][0] == set() and watcher.subscriber.held["DISK"][0] == disk != set()

    restarted = Watcher(tmp_path)
    assert restarted.rebuilt_equals_tiers() and restarted.subscriber.held["DISK"][0] == disk
    assert all(event["token_ids"] == [] and event["medium"] == "DISK" for event in restarted.subscriber.events)
    watcher.subscriber.close()
    restarted.subscriber.close()


def engine_held(engine) -> dict[str, set[bytes]]:
    """Per medium, the chain hashes the engine holds, from its own bookkeeping (the device pool's and the tiers')."""
    device = {block_hash for _, block_hash in engine.scheduler.kv_cache_manager.cached_blocks()}
    return {"GPU": device, **engine.features.lower_tiers.held_hashes()}


def rebuilt(subscriber: Subscriber) -> dict[str, set[bytes]]:
    subscriber.drain()
    return {medium: by_rank.get(0, set()) for medium, by_rank in subscriber.held.items()}


def test_engine_events_rebuild_device_host_and_disk_through_eviction_reload_reset(tiny_model_dir, tmp_path):
    """A 24-block pool spills to host memory (6 blocks) and disk (5 files), a repeated prompt loads back from the
    tiers, a reset leaves the disk, and a restarted engine announces the disk's files: after each, the subscriber's sets
    per medium are the engine's."""
    from jaxpaged.config import EngineConfig
    from jaxpaged.engine import LLMEngine
    from jaxpaged.sampling.params import SamplingParams
    from jaxpaged.weights.loader import load_model
    from tests.conftest import TINY_ENGINE_OPTIONS

    block_bytes = 2 * 2 * 2 * 16 * 16 * 4  # layers, K and V, KV heads, head_dim, tokens, float32
    endpoint, topic = f"inproc://kv-tier-events-{uuid.uuid4().hex}", "kv"
    options = {**TINY_ENGINE_OPTIONS, "num_kv_blocks": 24, "kv_offload_memory": 6 * block_bytes,
               "kv_offload_dir": str(tmp_path), "kv_offload_dir_max_bytes": 5 * (block_bytes + 400),
               "kv_offload_min_load_blocks": 1,
               "kv_events_config": json.dumps({"enable_kv_cache_events": True, "endpoint": endpoint, "topic": topic})}
    engine = LLMEngine(load_model(str(tiny_model_dir)), EngineConfig.from_options(**options), warmup=False)
    subscriber = Subscriber(endpoint, topic, block_size=16)
    time.sleep(0.2)  # PUB/SUB: a subscription takes effect once the publisher has seen it
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def run(prompts: list[list[int]]) -> None:
        for prompt in prompts:
            engine.add_request(f"r{uuid.uuid4().hex}", {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            engine.step()

    first = list(range(100, 180))  # 5 full blocks
    run([first] + [list(range(1000 + 90 * i, 1080 + 90 * i)) for i in range(6)])
    assert rebuilt(subscriber) == engine_held(engine)
    counts = subscriber.counts_by_medium
    assert all(counts.get((kind, medium), 0) > 0 for kind in ("BlockStored", "BlockRemoved")
               for medium in ("GPU", "CPU", "DISK")), counts

    stats = engine.get_stats().kv_tiers
    hits_before = stats["host"].hit_blocks + stats["disk"].hit_blocks
    run([first + [7]])  # its blocks left the device: loaded back from the tiers
    stats = engine.get_stats().kv_tiers
    assert stats["host"].hit_blocks + stats["disk"].hit_blocks > hits_before
    assert rebuilt(subscriber) == engine_held(engine)

    assert engine.reset_prefix_cache()
    held = engine_held(engine)
    assert held["GPU"] == held["CPU"] == set() != held["DISK"]
    assert rebuilt(subscriber) == held
    # Every block this engine cached was announced with its tokens, whichever medium (the subscriber checked each
    # hash against its parent and tokens).
    assert all(event["token_ids"] for event in subscriber.events if event["type"] == "BlockStored")
    engine.close()  # persists the host tier and the device's cached blocks to disk
    subscriber.close()

    # A restarted engine announces the files it finds, without tokens (their headers carry none).
    options["kv_events_config"] = json.dumps({"enable_kv_cache_events": True, "endpoint": endpoint + "-2",
                                              "topic": topic})
    engine = LLMEngine(load_model(str(tiny_model_dir)), EngineConfig.from_options(**options), warmup=False)
    subscriber = Subscriber(endpoint + "-2", topic, block_size=16)
    time.sleep(0.2)
    engine.step()  # publishes what warm-up recorded
    held = engine_held(engine)
    assert rebuilt(subscriber) == held and held["DISK"]
    assert {event["medium"] for event in subscriber.events} == {"DISK"}
    assert all(event["token_ids"] == [] for event in subscriber.events)
    engine.close()
    subscriber.close()


def test_every_data_parallel_rank_is_told_of_the_shared_tiers(tmp_path):
    """The ranks share the tiers (any of them loads from them): each rank's log gets the same tier events."""
    tiers = KVTiers([FINGERPRINT], host_bytes=PAYLOAD.nbytes, disk_directory=str(tmp_path), disk_bytes=1100)
    logs = [KVEventLog(BLOCK_SIZE), KVEventLog(BLOCK_SIZE)]
    recorder = TierEventRecorder(logs)
    tiers.record_events(recorder)
    for block_hash, record in chain(2, first_token=0):
        recorder.remember(block_hash, record)
        tiers.store(block_hash, [PAYLOAD])
    rank_events = [log.take() for log in logs]
    assert [(fields["type"], fields["medium"]) for fields in map(named_fields, rank_events[0])] == [
        ("BlockStored", "CPU"), ("BlockRemoved", "CPU"), ("BlockStored", "CPU"), ("BlockStored", "DISK")]
    assert rank_events[0] == rank_events[1]
