"""Issue 43 item 14, at small scale: six prompts, each too long for the device pool to keep more than two, asked one
at a time and then again (each with a few more tokens); every second visit hits all of its first visit's full
blocks, from host memory or from a disk tier that a process exiting without close() left behind."""

import json

import pytest

from tests.json_worker import run_json_worker
from tests.kv_tiers.tier_worker import GREEDY
from tests.prefix_prompts import token_ids

pytestmark = pytest.mark.xdist_group("kv_tiers")

# 16-token blocks. A first visit holds 13 blocks (200 prompt tokens, 4 generated), a second one 14: 29 usable
# blocks keep two prompts on the device, never six (the scale: 600 tokens and a 90-block pool).
OPTIONS = dict(max_model_len=256, max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=30, block_size=16,
               dtype="float32", attention_backend="xla", compilation_cache_dir="", kv_offload_min_load_blocks=1)
PROMPT_LEN = 200
FIRST_VISITS = [token_ids(seed, PROMPT_LEN) for seed in range(11, 17)]
SECOND_VISITS = [prompt + token_ids(seed + 100, 8) for seed, prompt in enumerate(FIRST_VISITS)]
# A second visit's 208 tokens hold 13 full blocks; its last token is always computed, so 12 blocks (192 tokens)
# can hit, and the first visit wrote all 12 of them.
EXPECTED_HIT_TOKENS = (len(SECOND_VISITS[0]) - 1) // 16 * 16
WORKER_TIMEOUT_S = 300


def ask_all(llm, prompts: list[list[int]]) -> list[int]:
    return [llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].num_cached_tokens
            for prompt in prompts]


def test_every_second_visit_hits_from_the_host_tier(tiny_model_dir):
    """Loading a revisited prompt's blocks evicts the others' from the device; those go down too (the bug: they
    were dropped when the evicted block became the load's destination, so prompts 4-6 missed)."""
    from jaxpaged.llm import LLM

    llm = LLM(str(tiny_model_dir), **OPTIONS, kv_offload_memory="64MiB")
    assert EXPECTED_HIT_TOKENS == 192
    assert ask_all(llm, FIRST_VISITS) == [0] * 6
    assert ask_all(llm, SECOND_VISITS) == [EXPECTED_HIT_TOKENS] * 6
    assert llm.engine.get_stats().kv_tiers["host"].hit_blocks >= 4 * 12  # at least prompts 1-4 came from the host


@pytest.fixture(scope="module")
def exit_runs(tiny_model_dir, tmp_path_factory) -> dict:
    """exit_worker's two LLMs in one process: "drop" (deleted and collected) and "exit" (alive at the interpreter's
    exit), each on a disk tier of its own (result["dirs"]), neither ever closed."""
    dirs = {name: tmp_path_factory.mktemp(f"disk-{name}") for name in ("drop", "exit")}
    result = run_json_worker("tests.kv_tiers.exit_worker", [
        str(tiny_model_dir), json.dumps(FIRST_VISITS),
        *(json.dumps(dict(OPTIONS, kv_offload_dir=str(dirs[name]))) for name in ("drop", "exit"))], 1,
        WORKER_TIMEOUT_S)
    return dict(result, dirs=dirs)


def run_second_visits(model_dir, options: dict) -> list[int]:
    (result,) = run_json_worker("tests.kv_tiers.tier_worker",
                                [str(model_dir), json.dumps([{"options": options, "prompts": SECOND_VISITS}])], 1,
                                WORKER_TIMEOUT_S)
    return [answer["num_cached_tokens"] for answer in result["answers"]]


def test_a_process_exiting_without_close_leaves_every_prompt_on_disk(tiny_model_dir, exit_runs):
    """Disk tier only: the first process asks the six prompts and exits with its LLM alive and never closed; the
    last two prompts' blocks were still on its device, and are persisted at exit, so a new process hits all six."""
    disk = exit_runs["dirs"]["exit"]
    assert exit_runs["exit"]["num_cached_tokens"] == [0] * 6
    assert len(list(disk.rglob("*.kv"))) == 6 * 12
    assert run_second_visits(tiny_model_dir, dict(OPTIONS, kv_offload_dir=str(disk))) == [EXPECTED_HIT_TOKENS] * 6


def test_a_dropped_llm_persists_when_collected(exit_runs):
    """An LLM deleted without close() persists its device's cached blocks when garbage-collected, not only at exit."""
    assert exit_runs["drop"]["num_cached_tokens"] == [0] * 6
    assert exit_runs["drop"]["files_after_drop"] == 6 * 12
