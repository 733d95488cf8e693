"""JSON and markdown results, and the online helpers that need no server."""

import json
import math

import pytest

from jaxpaged.bench.online_runner import conversation_groups, poisson_offsets
from jaxpaged.bench.results_writer import fmt, peer_ratios, render_markdown, write_json
from jaxpaged.bench.server_process import parse_metrics, serve_command
from jaxpaged.bench.workloads import BenchRequest


def fake_run():
    metrics = {"requests_per_s": 2.0, "input_tokens_per_s": 300.0, "output_tokens_per_s": 128.0,
               "ttft_ms_p50": 12.5, "num_compilations_measured": 0, "peak_kv_usage": 0.5,
               "prefix_cache_hit_rate": 0.25, "kv_utilization_mean": 0.96, "max_concurrent_requests": 9,
               "contiguous_max_model_len_max_concurrent": 2, "contiguous_max_model_len_kv_utilization": 0.2}
    return {"config_name": "demo", "description": "a demo", "config": {"sweep": {"mode.request_rate": [math.inf]}},
            "started_at": "2026-01-01T00:00:00+00:00", "machine": {"num_cpus": 2, "cpu": "cpu"},
            "model_name": "m", "targets": [{"name": "t", "value": 4.0, "bound": ">= 5", "passed": False,
                                             "detail": "d"}],
            "rows": [{"system": "jaxpaged", "kind": "jaxpaged", "point": {"mode.request_rate": math.inf},
                      "workload_key": "w", "status": "ok", "metrics": metrics, "repeats": [metrics]},
                     {"system": "hf_batched(bs=16)", "kind": "hf_batched", "point": {}, "workload_key": "w",
                      "status": "ok", "metrics": {"output_tokens_per_s": 32.0}, "repeats": []},
                     {"system": "llama_cpp", "kind": "llama_cpp", "point": {}, "workload_key": "w",
                      "status": "unavailable", "error": "not installed", "metrics": {}, "repeats": []}]}


def test_json_is_valid_with_inf(tmp_path):
    path = write_json(fake_run(), tmp_path / "run.json")
    data = json.loads(path.read_text())  # strict JSON: no bare Infinity
    assert "Infinity" not in path.read_text()
    assert data["rows"][0]["point"]["mode.request_rate"] == "inf"


def test_markdown_tables_ratios_misses_and_unavailable_peers():
    text = render_markdown(fake_run())
    assert "| jaxpaged | inf | 2 | 300 | 128 | 4× | – |" in text
    assert "llama_cpp (unavailable: not installed)" in text
    assert "**MISSED** — t: 4" in text
    assert "96.0%" in text  # the KV utilization table
    assert "noisy" in text


def test_peer_ratio_only_on_the_same_workload():
    run = fake_run()
    run["rows"][1]["workload_key"] = "another"
    assert peer_ratios(run["rows"][0], run["rows"]) == {"llama_cpp": None}


@pytest.mark.parametrize("value, text", [(None, "–"), (3, "3"), (0.12345, "0.123"), (1234.5, "1234"),
                                         (math.inf, "inf"), (True, "yes")])
def test_fmt(value, text):
    assert fmt(value) == text


def test_poisson_offsets_rate_and_inf():
    offsets = poisson_offsets(20001, 4.0, seed=0)
    assert offsets[0] == 0.0 and all(b >= a for a, b in zip(offsets, offsets[1:]))
    assert abs(offsets[-1] / 20000 - 0.25) < 0.01  # mean gap 1/rate
    assert poisson_offsets(3, math.inf, seed=0) == [0.0, 0.0, 0.0]


def test_conversation_groups_keep_turn_order():
    requests = [BenchRequest((1,), 1, 0, 0), BenchRequest((2,), 1, 1, 0), BenchRequest((3,), 1),
                BenchRequest((1, 9), 1, 0, 1), BenchRequest((2, 9), 1, 1, 1)]
    assert conversation_groups(requests) == [[0, 3], [1, 4], [2]]


def test_serve_command_maps_options_to_flags():
    command = serve_command("/m", {"block_size": 8, "enable_prefix_caching": False, "max_num_seqs": 4}, 1234)
    assert command[1:4] == ["-m", "jaxpaged.cli", "serve"]
    assert command[command.index("--port") + 1] == "1234"
    assert command[command.index("--model") + 1] == "/m"
    assert command[command.index("--block-size") + 1] == "8"
    assert command[command.index("--max-num-seqs") + 1] == "4"
    assert "--no-prefix-caching" in command
    assert "--no-prefix-caching" not in serve_command(None, {"enable_prefix_caching": True}, 1)


def test_parse_metrics_reads_counters_and_gauges():
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    registry = CollectorRegistry()
    Counter("jaxpaged_xla_compilations", "c", registry=registry).inc(3)
    Gauge("jaxpaged_kv_cache_usage_perc", "g", registry=registry).set(0.25)
    Counter("jaxpaged_sequences_finished", "l", ["finish_reason"], registry=registry).labels("stop").inc()
    values = parse_metrics(generate_latest(registry).decode())
    assert values["jaxpaged_xla_compilations"] == 3.0
    assert values["jaxpaged_kv_cache_usage_perc"] == 0.25
    assert "jaxpaged_sequences_finished" not in values  # labelled samples are not engine-wide numbers


@pytest.mark.parametrize("with_axis", [True, False])
def test_plots_are_written_with_and_without_a_sweep_axis(tmp_path, with_axis):
    from jaxpaged.bench.plots import write_plots

    run = fake_run()
    if not with_axis:
        run["config"]["sweep"] = {}
        run["rows"][0]["point"] = {}
    paths = write_plots(run, tmp_path, "mode.request_rate" if with_axis else None)
    assert [p.name for p in paths] == ["demo_throughput.png", "demo_latency.png", "demo_kv.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
