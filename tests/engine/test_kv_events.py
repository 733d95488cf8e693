"""KV cache events: a subscriber that applies the published events (vLLM's wire format) rebuilds exactly the set of
blocks the engine's prefix cache holds, through stores, evictions and a reset; every stored block's hash can be
recomputed from its parent, tokens and extra keys (the cache salt) as a router would."""

import json
import time
import uuid

import pytest

from jaxpaged.config import EngineConfig
from jaxpaged.engine import LLMEngine
from jaxpaged.features.kv_events import encode_batch, named_fields
from jaxpaged.kv_events_config import parse_kv_events_config
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA, save_tiny_llama
from tests.json_worker import run_json_worker

pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
from tests.engine.kv_events_subscriber import Subscriber  # noqa: E402 (needs zmq)

pytestmark = pytest.mark.xdist_group("tiny_llm")

TOPIC = "kv-events"
BLOCK_SIZE = 16


@pytest.fixture
def engine_and_subscriber(tiny_model_dir):
    endpoint = f"inproc://kv-events-{uuid.uuid4().hex}"
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": TOPIC})
    # A pool of 24 blocks: the prompts below cannot all stay cached, so evictions are published too.
    options = {**TINY_ENGINE_OPTIONS, "num_kv_blocks": 24, "kv_events_config": config, "async_scheduling": False}
    engine = LLMEngine(load_model(str(tiny_model_dir)), EngineConfig.from_options(**options), warmup=False)
    subscriber = Subscriber(endpoint, TOPIC, BLOCK_SIZE)
    time.sleep(0.2)  # PUB/SUB: a subscription takes effect once the publisher has seen it
    yield engine, subscriber
    engine.close()
    subscriber.close()


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
    assert subscriber.cached[0] == engine_cached_hashes(engine) != set()

    # Enough new prompts to evict most of what is cached.
    run(engine, [{"prompt_token_ids": list(range(1000 + 90 * i, 1080 + 90 * i))} for i in range(4)])
    subscriber.drain()
    assert subscriber.counts["BlockRemoved"] > 0
    assert subscriber.cached[0] == engine_cached_hashes(engine)

    assert engine.reset_prefix_cache()
    subscriber.drain()
    assert subscriber.counts["AllBlocksCleared"] == 1
    assert subscriber.cached[0] == engine_cached_hashes(engine) == set()

    run(engine, [{"prompt_token_ids": shared}])  # caching starts again after the reset
    subscriber.drain()
    assert subscriber.cached[0] == engine_cached_hashes(engine) != set()


def test_salted_first_block_carries_its_salt_and_differs_from_the_unsalted_one(engine_and_subscriber):
    engine, subscriber = engine_and_subscriber
    tokens = list(range(500, 532))  # two full blocks
    run(engine, [{"prompt_token_ids": tokens, "cache_salt": "tenant-a"}], max_tokens=1)
    run(engine, [{"prompt_token_ids": tokens}], max_tokens=1)
    subscriber.drain()
    firsts = [event for event in subscriber.events
              if event["type"] == "BlockStored" and event["parent_block_hash"] is None]
    assert [event["extra_keys"] for event in firsts] == [[["cache_salt", "tenant-a"]], [None]]
    assert firsts[0]["block_hashes"] != firsts[1]["block_hashes"]  # the same tokens, another tenant: another chain


def test_events_are_off_unless_enabled(tiny_model_dir):
    options = {**TINY_ENGINE_OPTIONS, "kv_events_config": '{"enable_kv_cache_events": false}'}
    engine = LLMEngine(load_model(str(tiny_model_dir)), EngineConfig.from_options(**options), warmup=False)
    assert engine.scheduler.kv_cache_manager.block_pool.events is None


def test_wire_layouts_match_vllms_structs_as_maps_and_as_arrays():
    from jaxpaged.core.kv_events import KVEventLog

    log = KVEventLog(block_size=16)
    log.stored(b"h" * 32, None, tuple(range(16)), ("cache_salt", "s"))
    log.removed(b"h" * 32)
    events = log.take()
    stored = {"type": "BlockStored", "block_hashes": [b"h" * 32], "parent_block_hash": None,
              "token_ids": list(range(16)), "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None,
              "extra_keys": [["cache_salt", "s"]]}
    removed = {"type": "BlockRemoved", "block_hashes": [b"h" * 32], "medium": "GPU"}
    assert msgpack.unpackb(encode_batch(events, 3, ts=1.5)) == [1.5, [stored, removed], 3]
    assert msgpack.unpackb(encode_batch(events, 3, "array", ts=1.5)) == [
        1.5, [["BlockStored", [b"h" * 32], None, list(range(16)), 16, None, "GPU", None, [["cache_salt", "s"]]],
              ["BlockRemoved", [b"h" * 32], "GPU"]], 3]
    log.stored(b"x" * 32, None, tuple(range(16)))
    log.cleared()  # a reset supersedes what came before it
    assert [named_fields(event) for event in log.take()] == [{"type": "AllBlocksCleared"}]


@pytest.mark.parametrize("text, message", [
    ('{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*:5558"}', "unsupported keys"),
    ('{"publisher": "kafka"}', "publisher"), ("[1]", "JSON object"), ("{", "not valid JSON"),
    ('{"endpoint": "5557"}', "endpoint"), ('{"event_layout": "tuple"}', "event_layout")])
def test_bad_configs_are_refused_naming_the_problem(text, message):
    with pytest.raises(ValueError, match=f"kv_events_config: .*{message}"):
        parse_kv_events_config(text)
    with pytest.raises(ValueError, match="kv_events_config"):
        EngineConfig.from_options(kv_events_config=text)


def test_each_data_parallel_rank_publishes_its_own_cache(tmp_path, smollm2_tokenizer_dir):
    """dp=2 on two forced CPU devices: batches name their rank, and each rank's rebuilt set is that rank's cache
    (events sent in the older positional-array layout)."""
    model_dir = save_tiny_llama(tmp_path / "mha", smollm2_tokenizer_dir,
                                TINY_LLAMA | dict(num_attention_heads=4, num_key_value_heads=4))
    result = run_json_worker("tests.engine.kv_events_worker", [str(model_dir)], 2, 300)
    assert result["ranks_with_blocks"] == [0, 1]  # distinct prompts spread over both ranks
    assert result["rebuilt_equals_engine"] == [True, True]
    assert result["after_reset"] == [0, 0]
