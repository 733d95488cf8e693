"""KV cache events: a subscriber that applies the published events (vLLM's wire format) rebuilds exactly the set of
blocks the engine's prefix cache holds, through stores, evictions and a reset; every stored block's hash can be
recomputed from its parent, tokens and extra keys (the cache salt) as a router would."""

import json
import time
import uuid

import pytest

from jaxpaged.config import EngineConfig
from jaxpaged.core.hashing import hash_block_tokens
from jaxpaged.engine import LLMEngine
from jaxpaged.features.kv_events import encode_batch, event_fields
from jaxpaged.kv_events_config import parse_kv_events_config
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.conftest import TINY_ENGINE_OPTIONS

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

pytestmark = pytest.mark.xdist_group("tiny_llm")

TOPIC = "kv-events"
BLOCK_SIZE = 16


class Subscriber:
    """A router's view of the engine's device cache, kept only from the published events."""

    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        self.socket.connect(endpoint)
        self.cached: set[bytes] = set()
        self.ever_stored: set[bytes] = set()
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.next_sequence = 0

    def drain(self) -> None:
        while self.socket.poll(200):
            topic, sequence, payload = self.socket.recv_multipart()
            assert topic == TOPIC.encode()
            assert int.from_bytes(sequence, "big") == self.next_sequence  # nothing lost, nothing reordered
            self.next_sequence += 1
            ts, events, data_parallel_rank = msgpack.unpackb(payload)
            assert data_parallel_rank == 0 and abs(ts - time.time()) < 600
            for event in events:
                self.apply(event)

    def apply(self, event: list) -> None:
        kind = event[0]
        self.counts[kind] += 1
        if kind == "BlockStored":
            block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name = event[1:8]
            extra_keys = event[8] if len(event) > 8 else [None] * len(block_hashes)
            assert (block_size, lora_id, medium, lora_name) == (BLOCK_SIZE, None, "GPU", None)
            assert parent is None or parent in self.ever_stored  # chains are announced from their start
            for index, block_hash in enumerate(block_hashes):
                tokens = token_ids[index * block_size:(index + 1) * block_size]
                block_keys = extra_keys[index]
                keys = tuple(block_keys) if block_keys is not None else ()
                assert hash_block_tokens(parent, tokens, keys) == block_hash  # a router can recompute it
                parent = block_hash
                self.cached.add(block_hash)
                self.ever_stored.add(block_hash)
        elif kind == "BlockRemoved":
            assert event[2] == "GPU"
            for block_hash in event[1]:
                self.cached.remove(block_hash)  # only blocks it was told about are removed
        else:
            assert event == ["AllBlocksCleared"]
            self.cached.clear()


@pytest.fixture
def engine_and_subscriber(tiny_model_dir):
    endpoint = f"inproc://kv-events-{uuid.uuid4().hex}"
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": TOPIC})
    # A pool of 24 blocks: the prompts below cannot all stay cached, so evictions are published too.
    options = {**TINY_ENGINE_OPTIONS, "num_kv_blocks": 24, "kv_events_config": config, "async_scheduling": False}
    engine = LLMEngine(load_model(str(tiny_model_dir)), EngineConfig.from_options(**options), warmup=False)
    subscriber = Subscriber(endpoint)
    time.sleep(0.2)  # PUB/SUB: a subscription takes effect once the publisher has seen it
    yield engine, subscriber
    engine.close()
    subscriber.socket.close(linger=0)


def engine_cached_hashes(engine: LLMEngine) -> set[bytes]:
    return {block_hash for _, block_hash in engine.scheduler.kv_cache_manager.cached_blocks()}


def run(engine: LLMEngine, prompts: list, max_tokens: int = 8) -> None:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{uuid.uuid4().hex}-{index}", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()


def test_subscriber_rebuilds_the_cached_set_through_evictions_and_reset(engine_and_subscriber):
    engine, subscriber = engine_and_subscriber
    shared = list(range(100, 140))  # 2.5 blocks shared by the first two prompts
    run(engine, [{"prompt_token_ids": shared + list(range(200, 230))},
                 {"prompt_token_ids": shared + list(range(300, 330))},
                 {"prompt_token_ids": shared, "cache_salt": "tenant-a"}])
    subscriber.drain()
    assert subscriber.counts["BlockStored"] > 0
    assert subscriber.cached == engine_cached_hashes(engine) != set()

    # Enough new prompts to evict most of what is cached.
    run(engine, [{"prompt_token_ids": list(range(1000 + 90 * i, 1080 + 90 * i))} for i in range(4)])
    subscriber.drain()
    assert subscriber.counts["BlockRemoved"] > 0
    assert subscriber.cached == engine_cached_hashes(engine)

    assert engine.reset_prefix_cache()
    subscriber.drain()
    assert subscriber.counts["AllBlocksCleared"] == 1
    assert subscriber.cached == engine_cached_hashes(engine) == set()

    run(engine, [{"prompt_token_ids": shared}])  # caching starts again after the reset
    subscriber.drain()
    assert subscriber.cached == engine_cached_hashes(engine) != set()


def test_salted_first_block_carries_its_salt_and_differs_from_the_unsalted_one(engine_and_subscriber):
    engine, subscriber = engine_and_subscriber
    tokens = list(range(500, 532))  # two full blocks
    stored: list[list] = []
    subscriber.apply = lambda event, original=subscriber.apply: (stored.append(event), original(event))
    run(engine, [{"prompt_token_ids": tokens, "cache_salt": "tenant-a"}], max_tokens=1)
    run(engine, [{"prompt_token_ids": tokens}], max_tokens=1)
    subscriber.drain()
    firsts = [event for event in stored if event[0] == "BlockStored" and event[2] is None]
    assert [event[8] if len(event) > 8 else None for event in firsts] == [[["cache_salt", "tenant-a"]], None]
    assert firsts[0][1] != firsts[1][1]  # the same tokens, another tenant: another chain


def test_events_are_off_unless_enabled(tiny_model_dir):
    options = {**TINY_ENGINE_OPTIONS, "kv_events_config": '{"enable_kv_cache_events": false}'}
    engine = LLMEngine(load_model(str(tiny_model_dir)), EngineConfig.from_options(**options), warmup=False)
    assert engine.scheduler.kv_cache_manager.block_pool.events is None


def test_wire_layout_matches_vllms_array_structs():
    from jaxpaged.core.kv_events import KVEventLog

    log = KVEventLog(block_size=16)
    log.stored(b"h" * 32, None, tuple(range(16)), ("cache_salt", "s"))
    log.removed(b"h" * 32)
    events = log.take()
    assert [event_fields(event)[0] for event in events] == ["BlockStored", "BlockRemoved"]
    assert msgpack.unpackb(encode_batch(events, 3, ts=1.5)) == [
        1.5, [["BlockStored", [b"h" * 32], None, list(range(16)), 16, None, "GPU", None, [["cache_salt", "s"]]],
              ["BlockRemoved", [b"h" * 32], "GPU"]], 3]
    log.stored(b"x" * 32, None, tuple(range(16)))
    log.cleared()  # a reset supersedes what came before it
    assert [event_fields(event) for event in log.take()] == [["AllBlocksCleared"]]


@pytest.mark.parametrize("text, message", [
    ('{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:5558"}', "unsupported keys"),
    ('{"publisher": "kafka"}', "publisher"), ("[1]", "JSON object"), ("{", "not valid JSON"),
    ('{"endpoint": "5557"}', "endpoint")])
def test_bad_configs_are_refused_naming_the_problem(text, message):
    with pytest.raises(ValueError, match=f"kv_events_config: .*{message}"):
        parse_kv_events_config(text)
    with pytest.raises(ValueError, match="kv_events_config"):
        EngineConfig.from_options(kv_events_config=text)
