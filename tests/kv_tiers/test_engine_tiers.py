"""The KV tiers end to end through LLM: a device pool too small for the workload's 1,000-token prefixes hits them
from host memory or disk, token-identical to an engine whose pool keeps everything and to one without tiers; a
damaged disk entry is a miss; salts stay apart in every tier."""

import json
import pathlib

import pytest

from tests.json_worker import run_json_worker
from tests.lazy_compile import warmed_up_as_served
from tests.prefix_prompts import ask, same_completion, token_ids

pytestmark = pytest.mark.xdist_group("kv_tiers")

# 16-token blocks; 79 usable blocks hold one 1,000-token prompt (63 blocks) but not two.
SMALL_POOL = dict(max_model_len=1100, max_num_seqs=4, max_num_batched_tokens=256, num_kv_blocks=80, block_size=16,
                  dtype="float32", attention_backend="xla", compilation_cache_dir="")
BIG_POOL = dict(SMALL_POOL, num_kv_blocks=400)
PREFIX_LEN = 1000


def tier_hits(llm, tier: str) -> int:
    return llm.engine.get_stats().kv_tiers[tier].hit_blocks


WORKER_TIMEOUT_S = 300
# 1,009-token prompts: a 1,000-token prefix and a 9-token question; 63 full blocks, all hittable.
PROMPTS = {name: token_ids(seed, PREFIX_LEN) + token_ids(seed + 100, 9)
           for seed, name in enumerate("abcdef", start=1)}


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Each prompt's completion from a pool big enough to keep everything, with the tiers off; and the same from
    the small pool with the tiers off (which recomputes)."""
    from jaxpaged.llm import LLM

    big, small = LLM(str(tiny_model_dir), **BIG_POOL), LLM(str(tiny_model_dir), **SMALL_POOL)
    references = {name: ask(big, prompt) for name, prompt in PROMPTS.items()}
    for name, prompt in PROMPTS.items():
        assert same_completion(ask(small, prompt), references[name])
    return references


def run_worker(model_dir, runs: list[dict], num_devices: int = 1) -> list[dict]:
    return run_json_worker("tests.kv_tiers.tier_worker", [str(model_dir), json.dumps(runs)], num_devices,
                           WORKER_TIMEOUT_S)


def same_answer(answer: dict, want) -> bool:
    want = want.outputs[0]
    return answer["token_ids"] == want.token_ids and answer["cumulative_logprob"] == pytest.approx(
        want.cumulative_logprob, abs=1e-4)


def block_file(llm, directory: pathlib.Path, prompt: list[int], block_index: int) -> pathlib.Path:
    """The file of the prompt's block block_index in the llm's (single-shard) disk tier under `directory`."""
    from jaxpaged.core.hashing import hash_block_tokens

    block_hash = None
    for index in range(block_index + 1):
        block_hash = hash_block_tokens(block_hash, prompt[index * 16:(index + 1) * 16])
    assert block_hash is not None
    (fingerprint,) = llm.engine.features.lower_tiers.fingerprints
    return directory / fingerprint / block_hash.hex()[:2] / (block_hash.hex() + ".kv")


@pytest.fixture(scope="module")
def host_tier_llm(tiny_model_dir):
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # a test counts compiles while serving
        return LLM(str(tiny_model_dir), **SMALL_POOL, kv_offload_memory="64MiB", kv_offload_min_load_blocks=1)


def test_evicted_prefix_hits_from_host(host_tier_llm, reference):
    llm = host_tier_llm
    assert llm.reset_prefix_cache()
    first = ask(llm, PROMPTS["a"])
    assert first.num_cached_tokens == 0 and same_completion(first, reference["a"])
    other = ask(llm, PROMPTS["b"])  # evicts a's blocks from the device: they go to host memory
    assert other.num_cached_tokens == 0 and same_completion(other, reference["b"])
    host = llm.engine.get_stats().kv_tiers["host"]
    assert host.num_blocks >= 40 and 0 < host.bytes_used <= 64 * 2**20
    hits_before, compilations_before = tier_hits(llm, "host"), llm.engine.get_stats().num_compilations
    again = ask(llm, PROMPTS["a"])
    # All of a's 63 full blocks (all but its last token): the evicted ones from host memory, in any case >= 40.
    assert again.num_cached_tokens == 1008
    assert tier_hits(llm, "host") - hits_before >= 40
    assert same_completion(again, reference["a"])
    assert llm.engine.get_stats().num_compilations == compilations_before  # transfers were compiled at start-up


def test_salts_stay_apart_in_the_host_tier(host_tier_llm, reference):
    llm = host_tier_llm
    assert llm.reset_prefix_cache()
    assert ask(llm, PROMPTS["c"], salt="tenant-1").num_cached_tokens == 0
    ask(llm, PROMPTS["d"], salt="tenant-1")  # evicts c's blocks to host memory
    hits_before = tier_hits(llm, "host")
    other_tenant = ask(llm, PROMPTS["c"], salt="tenant-2")
    assert other_tenant.num_cached_tokens == 0 and tier_hits(llm, "host") == hits_before
    assert same_completion(other_tenant, reference["c"])
    ask(llm, PROMPTS["e"], salt="tenant-2")
    same_tenant = ask(llm, PROMPTS["c"], salt="tenant-1")
    assert same_tenant.num_cached_tokens == 1008 and tier_hits(llm, "host") > hits_before
    assert same_completion(same_tenant, reference["c"])


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("kv-disk-tier")


DISK_ONLY = dict(SMALL_POOL, kv_offload_min_load_blocks=1)


@pytest.fixture(scope="module")
def disk_tier_llm(tiny_model_dir, disk_dir):
    """No host tier: the device's evictions go straight to disk."""
    from jaxpaged.llm import LLM

    return LLM(str(tiny_model_dir), **DISK_ONLY, kv_offload_dir=str(disk_dir))


def test_disk_tier_survives_a_restart_in_a_new_process(disk_tier_llm, disk_dir, tiny_model_dir, reference):
    llm = disk_tier_llm
    for name in "abc":  # each prompt evicts the one before it: a is wholly on disk after c
        assert same_completion(ask(llm, PROMPTS[name]), reference[name])
    assert block_file(llm, disk_dir, PROMPTS["a"], 0).exists() and block_file(llm, disk_dir, PROMPTS["a"], 62).exists()
    options = dict(DISK_ONLY, kv_offload_dir=str(disk_dir))
    # A different block size is another fingerprint: it never reads these files (and writes its own elsewhere).
    changed, same = run_worker(tiny_model_dir, [
        {"options": dict(options, block_size=8, num_kv_blocks=160), "prompts": [PROMPTS["a"]]},
        {"options": options, "prompts": [PROMPTS["a"]]}])
    assert changed["answers"][0]["num_cached_tokens"] == 0 and changed["tiers"]["disk"]["hit_blocks"] == 0
    assert same_answer(changed["answers"][0], reference["a"])
    assert same["answers"][0]["num_cached_tokens"] == 1008 and same["tiers"]["disk"]["hit_blocks"] == 63
    assert same_answer(same["answers"][0], reference["a"])
    assert len([path for path in disk_dir.iterdir() if path.is_dir()]) == 2  # one directory per fingerprint


def test_a_corrupted_disk_entry_is_a_miss(disk_tier_llm, disk_dir, reference):
    llm = disk_tier_llm
    for name in "def":
        ask(llm, PROMPTS[name])
    damaged = block_file(llm, disk_dir, PROMPTS["d"], 30)
    data = bytearray(damaged.read_bytes())
    data[-100] ^= 0x01  # one bit of one K/V value
    damaged.write_bytes(bytes(data))
    corrupt_before = llm.engine.get_stats().kv_tiers["disk"].corrupt_entries
    out = ask(llm, PROMPTS["d"])
    assert out.num_cached_tokens == 30 * 16  # the blocks before the damaged one load; the rest is recomputed
    assert same_completion(out, reference["d"])
    assert llm.engine.get_stats().kv_tiers["disk"].corrupt_entries == corrupt_before + 1
    assert not damaged.exists() or damaged.read_bytes() != bytes(data)  # removed (or rewritten whole)


def test_tensor_and_data_parallel_tiers_store_each_shard(tiny_model_dir, tmp_path, reference):
    """tp=2: each device offloads and reloads its own shard (one fingerprint directory per shard); dp=2: the
    ranks share the tiers. Host memory for a few blocks only, so most go on to disk."""
    tiers = dict(SMALL_POOL, kv_offload_memory=8 * 2**20, kv_offload_min_load_blocks=1)
    prompts = [PROMPTS[name] for name in "abca"]
    tp2, dp2 = run_worker(tiny_model_dir, [
        {"options": dict(tiers, tensor_parallel_size=2, kv_offload_dir=str(tmp_path / "tp2")), "prompts": prompts},
        {"options": dict(tiers, data_parallel_size=2, kv_offload_dir=str(tmp_path / "dp2")), "prompts": prompts}],
        num_devices=2)
    assert tp2["kv_shards"] == 2
    assert len([path for path in (tmp_path / "tp2").iterdir() if path.is_dir()]) == 2
    for result in (tp2, dp2):
        for answer, name in zip(result["answers"], "abca"):
            assert same_answer(answer, reference[name]), name
        assert result["answers"][-1]["num_cached_tokens"] == 1008
        assert result["tiers"]["host"]["hit_blocks"] + result["tiers"]["disk"]["hit_blocks"] >= 40
        assert result["tiers"]["host"]["bytes_used"] <= 8 * 2**20


def test_load_or_recompute_is_measured_at_start_up(host_tier_llm):
    """Without kv_offload_min_load_blocks the engine times a batch of loads and a prefill token, and recomputes
    shorter hits; the choice is a block count within the model length (or one past it: never load)."""
    from jaxpaged.features.kv_tiers import choose_min_load_blocks

    engine = host_tier_llm.engine
    load_seconds, token_seconds = engine.runner.measure_load_and_prefill_seconds()
    assert load_seconds > 0 and token_seconds > 0
    max_blocks = -(-engine.max_model_len // 16)
    try:
        chosen = choose_min_load_blocks(None, engine.runner, engine.ranks.schedulers, engine.max_model_len)
        assert 1 <= chosen <= max_blocks + 1
        assert all(s.kv_cache_manager.min_load_blocks == chosen for s in engine.ranks.schedulers)
    finally:
        choose_min_load_blocks(1, engine.runner, engine.ranks.schedulers, engine.max_model_len)
