"""Sweep configs: parsing, validation errors that name the field, and the cartesian expansion."""

import math
import pathlib
import re

import pytest

from jaxpaged.bench.bench_config import load_config, parse_config

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "configs" / "bench"


def minimal(**overrides) -> dict:
    raw = {"name": "t", "workload": {"kind": "random", "num_requests": 2}}
    raw.update(overrides)
    return raw


def test_defaults_give_one_offline_point():
    """No sweep: one point with the sections as written and the documented defaults."""
    config = parse_config(minimal(engine={"block_size": 8}))
    [point] = config.points()
    assert point.values == {}
    assert point.engine_options == {"block_size": 8}
    assert point.mode.kind == "offline" and point.mode.repeats == 1
    assert point.sampling.temperature == 0.0 and point.sampling.ignore_eos is True
    assert point.workload.num_requests == 2


def test_cartesian_product_last_axis_fastest():
    """Two axes of 2 and 3 values give 6 points in row-major order, each value landing in its section."""
    config = parse_config(minimal(sweep={"engine.block_size": [8, 16], "workload.num_requests": [1, 2, 3]}))
    points = config.points()
    assert [(p.values["engine.block_size"], p.values["workload.num_requests"]) for p in points] == [
        (8, 1), (8, 2), (8, 3), (16, 1), (16, 2), (16, 3)]
    assert [p.engine_options["block_size"] for p in points] == [8, 8, 8, 16, 16, 16]
    assert [p.workload.num_requests for p in points] == [1, 2, 3, 1, 2, 3]


def test_sweep_axis_overrides_base_value_without_touching_other_points():
    config = parse_config(minimal(engine={"block_size": 32, "max_num_seqs": 4},
                                  sweep={"engine.block_size": [8, 16]}))
    assert [p.engine_options for p in config.points()] == [{"block_size": 8, "max_num_seqs": 4},
                                                          {"block_size": 16, "max_num_seqs": 4}]
    assert config.engine == {"block_size": 32, "max_num_seqs": 4}


def test_joint_axis_sets_its_parameters_together():
    """(dp, tp) layouts are pairs, not a grid: (2, 2) would need 4 devices."""
    axis = "engine.(data_parallel_size, tensor_parallel_size)"
    config = parse_config(minimal(sweep={axis: [[1, 1], [1, 2], [2, 1]]}, cpu_devices=2))
    assert [(p.engine_options["data_parallel_size"], p.engine_options["tensor_parallel_size"])
            for p in config.points()] == [(1, 1), (1, 2), (2, 1)]
    assert config.cpu_devices == 2


def test_joint_axis_across_sections():
    """A restart point: engine options and a mode flag set together, never crossed into a grid."""
    axis = "(engine.kv_offload_memory, engine.kv_offload_dir, mode.fresh_engine)"
    config = parse_config(minimal(sweep={axis: [[0, None, False], ["1GiB", "/tmp/d", False],
                                                ["1GiB", "/tmp/d", True]]}))
    points = config.points()
    assert [(p.engine_options["kv_offload_memory"], p.engine_options["kv_offload_dir"], p.mode.fresh_engine)
            for p in points] == [(0, None, False), ("1GiB", "/tmp/d", False), ("1GiB", "/tmp/d", True)]


@pytest.mark.parametrize("axis", ["(engine.block_size, nosuch.x)", "(engine.block_size, mode)", "block_size",
                                  "(workload.kind, engine.block_size)"])
def test_malformed_axes_name_the_axis(axis):
    with pytest.raises(ValueError, match=re.escape(f"sweep.{axis}")):
        parse_config(minimal(sweep={axis: [[1, 2]]}))


@pytest.mark.parametrize("rate", ["inf", ".inf", math.inf])
def test_request_rate_inf_spellings(rate):
    raw = minimal(mode={"kind": "online", "request_rate": rate})
    if rate == ".inf":  # what YAML's .inf becomes
        raw["mode"]["request_rate"] = float("inf")
    assert math.isinf(parse_config(raw).points()[0].mode.request_rate)


@pytest.mark.parametrize("raw, field", [
    (minimal(bogus=1), "bogus"),
    (minimal(name="a b"), "name"),
    (minimal(sweep={"block_size": [8]}), "sweep.block_size"),
    (minimal(sweep={"server.port": [8]}), "sweep.server.port"),
    (minimal(sweep={"engine.block_size": []}), "sweep.engine.block_size"),
    (minimal(sweep={"workload.kind": ["random"]}), "sweep.workload.kind"),
    (minimal(engine={"blok_size": 8}), "blok_size"),
    (minimal(engine={"block_size": 0}), "block_size"),
    (minimal(workload={"kind": "nope"}), "workload.kind"),
    (minimal(workload={"kind": "random", "prompt_len": 3}), "workload.prompt_len"),
    (minimal(workload={"kind": "random", "min_prompt_len": 9, "max_prompt_len": 8}), "workload.min_prompt_len"),
    (minimal(mode={"kind": "batch"}), "mode.kind"),
    (minimal(mode={"repeats": 0}), "mode.repeats"),
    (minimal(mode={"request_rate": 0}), "mode.request_rate"),
    (minimal(mode={"max_concurrency": 0}), "mode.max_concurrency"),
    (minimal(sampling={"temperature": -1}), "sampling.temperature"),
    (minimal(peers=[{"kind": "vllm"}]), "peers[].kind"),
    (minimal(peers=[{"kind": "hf_batched", "options": {"n_ctx": 4}}]), "peers[].options.n_ctx"),
    (minimal(peers=[{"kind": "hf_continuous"}, {"kind": "hf_continuous"}]), "peers"),
    (minimal(mode={"kind": "online"}, peers=[{"kind": "hf_batched"}]), "peers"),
    (minimal(targets=[{"name": "x", "metric": "m"}]), "targets[].min"),
    (minimal(targets=[{"name": "x", "metric": "m", "numerator": {}, "min": 1}]), "targets[].denominator"),
    (minimal(plot_x="engine.block_size"), "plot_x"),
    (minimal(sweep={"engine.(data_parallel_size, tensor_parallel_size)": [[1, 1], [2]]}),
     "sweep.engine.(data_parallel_size"),
    (minimal(sweep={"engine.(data_parallel_size, tensor_parallel_size)": [[0, 1]]}), "data_parallel_size"),
    (minimal(cpu_devices=0), "cpu_devices"),
])
def test_bad_config_names_the_field(raw, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_config(raw)


def test_bad_value_at_one_sweep_point_says_which_point():
    with pytest.raises(ValueError, match=r"block_size.*sweep point \{'engine.block_size': 0\}"):
        parse_config(minimal(sweep={"engine.block_size": [16, 0]}))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(FileNotFoundError, match="config"):
        load_config(str(tmp_path / "none.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(str(bad))


def test_peer_names_are_distinct_per_setting():
    config = parse_config(minimal(peers=[{"kind": "hf_batched", "batch_size": 16},
                                         {"kind": "hf_batched", "batch_size": 64, "options": {"num_threads": 1}},
                                         {"kind": "hf_batched", "batch_size": 16, "options": {"dtype": "bfloat16"}},
                                         {"kind": "llama_cpp"}]))
    assert [peer.name for peer in config.peers] == ["hf_batched(bs=16)", "hf_batched(bs=64, num_threads=1)",
                                                    "hf_batched(bs=16, dtype=bfloat16)", "llama_cpp"]
    with pytest.raises(ValueError, match="peers\\[\\].options.dtype"):
        parse_config(minimal(peers=[{"kind": "hf_batched", "options": {"dtype": "float16"}}]))


SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))


def test_every_config_the_issue_names_is_shipped():
    names = {path.stem for path in SHIPPED}
    assert {"w1_offline", "decode_heavy", "shared_prefix", "serving_latency", "block_size_sweep",
            "kv_utilization"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_config_parses_and_fits_max_model_len(path):
    """Every shipped config validates, its name is its file name, and no request exceeds max_model_len."""
    from jaxpaged.bench.workloads import generate_requests

    config = load_config(str(path))
    assert config.name == path.stem
    for point in config.points():
        max_model_len = point.engine_options.get("max_model_len", 2048)
        longest = max(len(r.prompt_token_ids) + r.max_tokens for r in generate_requests(point.workload))
        assert longest <= max_model_len


def test_w1_config_is_the_w1_workload():
    """Issue #3's W1: 64 requests, prompts uniform 32-256, exactly 64 greedy tokens, EOS ignored, vs HF batched;
    in float32 and bfloat16 (issue #17), each against HF batched in the same dtype."""
    config = load_config(str(CONFIG_DIR / "w1_offline.yaml"))
    points = config.points()
    assert [point.engine_options["dtype"] for point in points] == ["float32", "bfloat16"]
    assert points[0].workload == points[1].workload
    point = points[0]
    peer_dtypes = {peer.options.get("dtype", "float32") for peer in config.peers if peer.kind == "hf_batched"}
    assert peer_dtypes == {"float32", "bfloat16"}
    w = point.workload
    assert (w.num_requests, w.min_prompt_len, w.max_prompt_len, w.min_output_len, w.max_output_len) == (
        64, 32, 256, 64, 64)
    assert point.sampling.temperature == 0.0 and point.sampling.ignore_eos
    assert point.mode.kind == "offline"
    assert any(peer.kind == "hf_batched" for peer in config.peers)
    assert config.warmup_probe
