"""The KV tiers and KV events with KV cache groups on, end to end: a tiny Gemma 3 (sliding, full, sliding layers,
window 8, 4-token blocks) whose device pool is too small for the prompts (several windows long) hits host memory and
disk, token-identical to a pool that keeps everything with the groups off; its KV events, applied per
(medium, group) by a vLLM-style subscriber, always equal what the device and the tiers hold."""

import json
import time
import uuid
from typing import Optional

import pytest

from jaxpaged.core.kv_group_keys import split_group_key
from tests.engine.test_kv_cache_groups_engine import ENGINE, generate, prompts, save_checkpoint

pytest.importorskip("zmq")
pytest.importorskip("msgpack")
from tests.engine.kv_events_subscriber import Subscriber  # noqa: E402 (needs zmq)

pytestmark = pytest.mark.xdist_group("kv_tiers")

BLOCK_BYTES = 2 * 2 * 16 * 4 * 4  # one layer slot: K and V, 2 KV heads, head_dim 16, 4 tokens, float32
# 31 usable blocks: one 44-token prompt holds 11 full-group blocks and at most 7 in each sliding group (16-token
# chunks), so each prompt evicts most of the one before it.
SMALL_POOL = dict(ENGINE, block_size=4, num_kv_blocks=32, max_model_len=56)
BIG_POOL = dict(SMALL_POOL, num_kv_blocks=200)
TOKEN_PROMPTS = prompts(11, [44, 45, 46, 43, 44])


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory, smollm2_tokenizer_dir):
    directory = tmp_path_factory.mktemp("group-tiers-gemma3")
    save_checkpoint("gemma3", directory, smollm2_tokenizer_dir)
    return directory


@pytest.fixture(scope="module")
def reference(gemma3_dir):
    """Each prompt's output from a pool that keeps everything with the groups off (every layer keeps every token;
    tests/engine/test_kv_cache_groups_engine.py checks groups on against it)."""
    from jaxpaged.llm import LLM

    return generate(LLM(str(gemma3_dir), **BIG_POOL, disable_hybrid_kv_cache_manager=True), TOKEN_PROMPTS)


def same(got, want) -> bool:
    got, want = got.outputs[0], want.outputs[0]
    return got.token_ids == want.token_ids and got.cumulative_logprob == pytest.approx(want.cumulative_logprob,
                                                                                       abs=1e-4)


def engine_held(engine) -> dict[str, dict[Optional[int], set[bytes]]]:
    """Per medium and group, the chain hashes the engine holds, from its own bookkeeping."""
    held: dict[str, dict[Optional[int], set[bytes]]] = {"GPU": {}}
    for _, key in engine.scheduler.kv_cache_manager.cached_blocks():
        chain_hash, group = split_group_key(key)
        held["GPU"].setdefault(group, set()).add(chain_hash)
    for medium, keys in engine.features.lower_tiers.held_hashes().items():
        for key in keys:
            chain_hash, group = split_group_key(key)
            held.setdefault(medium, {}).setdefault(group, set()).add(chain_hash)
    return {medium: {group: hashes for group, hashes in by_group.items() if hashes}
            for medium, by_group in held.items() if any(by_group.values())}


def rebuilt(subscriber: Subscriber) -> dict[str, dict[Optional[int], set[bytes]]]:
    subscriber.drain()
    views = {medium: {key[1]: hashes for key, hashes in by_rank.items() if isinstance(key, tuple) and hashes}
             for medium, by_rank in subscriber.held.items()}
    assert all(not hashes for by_rank in subscriber.held.values() for key, hashes in by_rank.items()
               if not isinstance(key, tuple))  # every event named its group
    return {medium: view for medium, view in views.items() if view}


def test_a_small_pool_hits_host_and_disk_per_group_with_identical_tokens(gemma3_dir, tmp_path, reference):
    """Five prompts, then the first and the second again: their blocks left the device and come back from host
    memory (12 blocks) and disk, with the tokens and log-probabilities of the big pool without groups (as is every
    first answer, the small pool recomputing what it lost); the subscriber's view per
    (medium, group) is the engine's after every round."""
    from jaxpaged.llm import LLM

    endpoint, topic = f"inproc://kv-group-tiers-{uuid.uuid4().hex}", "kv"
    llm = LLM(str(gemma3_dir), **SMALL_POOL, kv_offload_memory=12 * BLOCK_BYTES, kv_offload_dir=str(tmp_path),
              kv_offload_min_load_blocks=1,
              kv_events_config=json.dumps({"enable_kv_cache_events": True, "endpoint": endpoint, "topic": topic}))
    engine = llm.engine
    assert engine.runner.plan.kv_spec.num_groups == 3  # the tiers and the events keep the groups on
    subscriber = Subscriber(endpoint, topic, block_size=4)
    time.sleep(0.2)  # PUB/SUB: a subscription takes effect once the publisher has seen it
    for prompt, want in zip(TOKEN_PROMPTS, reference):
        assert same(generate(llm, [prompt])[0], want)
        assert rebuilt(subscriber) == engine_held(engine)
    stats = engine.get_stats().kv_tiers
    assert stats["host"].num_blocks > 0 and stats["disk"].num_blocks > 0
    groups_below = {group for medium in ("CPU", "DISK") for group in rebuilt(subscriber).get(medium, {})}
    assert groups_below == {0, 1, 2}  # every group's blocks went down, under their own keys
    hits_before = {tier: stats[tier].hit_blocks for tier in ("host", "disk")}
    for index in (0, 1, 4):
        again = generate(llm, [TOKEN_PROMPTS[index]])[0]
        assert again.num_cached_tokens >= 32 and same(again, reference[index])
        assert rebuilt(subscriber) == engine_held(engine)
    stats = engine.get_stats().kv_tiers
    assert stats["host"].hit_blocks > hits_before["host"] and stats["disk"].hit_blocks > hits_before["disk"]
    # A hit's tokens count once, not once per group: the tiers' share never exceeds the prefix-cache hits.
    assert 0 < stats["host"].hit_tokens + stats["disk"].hit_tokens <= engine.get_stats().prefix_cache_hits
    assert stats["device"].hit_tokens >= 0
    subscriber.close()
    engine.close()
