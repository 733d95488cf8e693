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
        # Host memory for 2 blocks; disk for 3 files (each a header of about 200 bytes and the payload).
        self.tiers = KVTiers([FINGERPRINT], host_bytes=2 * PAYLOAD.nbytes, disk_directory=str(directory),
                             disk_bytes=900)
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
