"""Targets: bounds over selected rows, and ratios between selections on the same workload."""

import pytest

from jaxpaged.bench.bench_config import TargetConfig
from jaxpaged.bench.targets import evaluate_target, row_matches


def row(system, kind, point, metrics, key="w", status="ok"):
    return {"system": system, "kind": kind, "point": point, "metrics": metrics, "workload_key": key,
            "status": status}


ROWS = [
    row("jaxpaged", "jaxpaged", {"engine.enable_prefix_caching": True}, {"tps": 100.0, "ttft": 10.0, "c": 0}),
    row("jaxpaged", "jaxpaged", {"engine.enable_prefix_caching": False}, {"tps": 99.0, "ttft": 80.0, "c": 0}),
    row("hf_batched(bs=16)", "hf_batched", {}, {"tps": 20.0}),
    row("hf_batched(bs=64)", "hf_batched", {}, {"tps": 30.0}),
    row("hf_batched(bs=8)", "hf_batched", {}, {"tps": 1.0}, key="other workload"),
    row("llama_cpp", "llama_cpp", {}, {}, status="unavailable"),
]


def test_row_matching_by_kind_name_and_axis():
    assert row_matches(ROWS[2], {"system": "hf_batched"})
    assert row_matches(ROWS[2], {"system": "hf_batched(bs=16)"})
    assert not row_matches(ROWS[2], {"system": "hf_batched", "engine.block_size": 16})
    assert row_matches(ROWS[0], {"engine.enable_prefix_caching": True})


def test_a_selection_names_one_parameter_of_a_joint_axis():
    point = {"engine.(enable_prefix_caching, prefix_caching_granularity)": [True, "token"], "workload.head_len": 8}
    joint = row("jaxpaged", "jaxpaged", point, {})
    assert row_matches(joint, {"engine.enable_prefix_caching": True, "workload.head_len": 8})
    assert row_matches(joint, {"engine.prefix_caching_granularity": "token"})
    assert not row_matches(joint, {"engine.prefix_caching_granularity": "block"})
    assert not row_matches(joint, {"workload.enable_prefix_caching": True})  # another section's parameter
    assert not row_matches(joint, {"engine.block_size": 16})


def test_ratio_uses_the_least_favourable_pair_on_the_same_workload():
    """jaxpaged 100 and 99 tok/s against peers at 20 and 30 on its workload: the ratio that counts is 99/30."""
    target = TargetConfig(name="4x", metric="tps", numerator={"system": "jaxpaged"},
                          denominator={"system": "hf_batched"}, min=4.0)
    result = evaluate_target(target, ROWS)
    assert abs(result["value"] - 99 / 30) < 1e-9
    assert result["passed"] is False  # a miss is reported with its figure
    assert "hf_batched(bs=64)" in result["detail"]


def test_ratio_between_sweep_points():
    target = TargetConfig(name="ttft", metric="ttft", numerator={"engine.enable_prefix_caching": False},
                          denominator={"engine.enable_prefix_caching": True}, min=5.0)
    result = evaluate_target(target, ROWS)
    assert result["value"] == 8.0 and result["passed"] is True


def test_bound_over_rows_reports_the_worst():
    target = TargetConfig(name="no compiles", metric="c", select={"system": "jaxpaged"}, max=0)
    assert evaluate_target(target, ROWS)["passed"] is True
    failing = ROWS + [row("jaxpaged", "jaxpaged", {"engine.enable_prefix_caching": None}, {"c": 3})]
    result = evaluate_target(target, failing)
    assert result["value"] == 3 and result["passed"] is False


def test_unmeasured_target_is_neither_met_nor_missed():
    target = TargetConfig(name="llama", metric="tps", select={"system": "llama_cpp"}, min=1.0)
    result = evaluate_target(target, ROWS)
    assert result["passed"] is None and result["value"] is None


def test_dtype_selects_rows_by_precision_and_ratios_stay_within_one():
    """float32 against float32, bfloat16 against bfloat16: a selection's "dtype" is the precision a row ran in."""
    from jaxpaged.bench.results_writer import peer_ratios

    rows = [row("jaxpaged", "jaxpaged", {"engine.dtype": "float32"}, {"tps": 100.0, "dtype": "float32"}),
            row("jaxpaged", "jaxpaged", {"engine.dtype": "bfloat16"}, {"tps": 150.0, "dtype": "bfloat16"}),
            row("hf_batched(bs=16)", "hf_batched", {}, {"tps": 40.0}),  # no dtype recorded: float32
            row("hf_batched(bs=16, dtype=bfloat16)", "hf_batched", {}, {"tps": 50.0, "dtype": "bfloat16"})]
    assert row_matches(rows[3], {"system": "hf_batched", "dtype": "bfloat16"})
    assert not row_matches(rows[2], {"system": "hf_batched", "dtype": "bfloat16"})
    assert peer_ratios(rows[0], rows, "tps") == {"hf_batched(bs=16)": 2.5, "hf_batched(bs=16, dtype=bfloat16)": None}
    assert peer_ratios(rows[1], rows, "tps") == {"hf_batched(bs=16)": None, "hf_batched(bs=16, dtype=bfloat16)": 3.0}
    target = TargetConfig(name="bf16", metric="tps", numerator={"system": "jaxpaged", "dtype": "bfloat16"},
                          denominator={"system": "hf_batched", "dtype": "bfloat16"}, min=2.5)
    assert evaluate_target(target, rows)["value"] == 3.0


def test_the_faster_row_against_peers_in_its_own_dtype():
    """Which dtype is faster depends on the CPU: the target takes jaxpaged's faster row (bfloat16 here, 150 tok/s)
    and divides by the peers that ran in bfloat16 only (50), never by the float32 peer (40)."""
    rows = [row("jaxpaged", "jaxpaged", {"engine.dtype": "float32"}, {"tps": 100.0, "dtype": "float32"}),
            row("jaxpaged", "jaxpaged", {"engine.dtype": "bfloat16"}, {"tps": 150.0, "dtype": "bfloat16"}),
            row("hf_batched(bs=16)", "hf_batched", {}, {"tps": 40.0}),
            row("hf_batched(bs=16, dtype=bfloat16)", "hf_batched", {}, {"tps": 50.0, "dtype": "bfloat16"})]
    target = TargetConfig(name="best", metric="tps", numerator={"system": "jaxpaged"}, numerator_best=True,
                          denominator={"system": "hf_batched"}, pair_by=["dtype"], min=2.5)
    result = evaluate_target(target, rows)
    assert result["value"] == 3.0 and result["passed"]
    assert "150" in result["detail"] and "50" in result["detail"]
    # On a machine where float32 is the faster one, the float32 peer is the one that counts.
    rows[0]["metrics"]["tps"] = 200.0
    assert evaluate_target(target, rows)["value"] == 5.0
    # Without pairing, the least favourable ratio over both dtypes would count (200 / 50).
    unpaired = TargetConfig(name="best", metric="tps", numerator={"system": "jaxpaged"}, numerator_best=True,
                            denominator={"system": "hf_batched"}, min=2.5)
    assert evaluate_target(unpaired, rows)["value"] == 4.0


def test_pairing_needs_a_ratio():
    with pytest.raises(ValueError, match="numerator_best"):
        TargetConfig(name="bad", metric="tps", select={"system": "jaxpaged"}, numerator_best=True, min=1.0)
