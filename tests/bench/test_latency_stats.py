"""Metrics from timings, against hand-worked cases."""

import pytest

from jaxpaged.bench.latency_stats import (
    RequestTiming,
    latency_metrics,
    median_of_repeats,
    percentile_summary,
    throughput_metrics,
)


def two_requests():
    # A: arrives 0, tokens at 1, 2, 4 -> TTFT 1, E2E 4, TPOT (4-1)/2 = 1.5, ITLs 1 and 2.
    # B: arrives 1, one token at 3   -> TTFT 2, E2E 2, no TPOT, no ITL.
    return [RequestTiming(0.0, 1.0, 4.0, 10, 3, [1.0, 2.0, 4.0]), RequestTiming(1.0, 3.0, 3.0, 20, 1, [3.0])]


def test_hand_worked_latencies():
    m = latency_metrics(two_requests())
    assert m["ttft_ms_p50"] == pytest.approx(1500.0)  # median of 1 s and 2 s
    assert m["ttft_ms_mean"] == pytest.approx(1500.0)
    assert m["e2e_ms_p50"] == pytest.approx(3000.0)
    assert m["tpot_ms_p50"] == pytest.approx(1500.0) and m["tpot_ms_p99"] == pytest.approx(1500.0)
    assert m["itl_ms_p50"] == pytest.approx(1500.0)
    assert m["itl_ms_p99"] == pytest.approx(1990.0)  # linear interpolation between 1000 and 2000


def test_hand_worked_throughput():
    t = throughput_metrics(two_requests(), duration_s=4.0)
    assert t["requests_per_s"] == 0.5
    assert t["input_tokens_per_s"] == 30 / 4 and t["output_tokens_per_s"] == 4 / 4
    assert (t["total_input_tokens"], t["total_output_tokens"]) == (30, 4)


def test_zero_duration_is_an_error():
    with pytest.raises(ValueError, match="duration_s"):
        throughput_metrics(two_requests(), 0.0)


def test_empty_percentiles_are_none():
    assert percentile_summary("itl", []) == {"itl_ms_p50": None, "itl_ms_p90": None, "itl_ms_p99": None,
                                             "itl_ms_mean": None}


def test_median_of_repeats_takes_worst_counters():
    repeats = [{"output_tokens_per_s": 10.0, "num_compilations_measured": 0, "peak_kv_usage": 0.5, "note": None},
               {"output_tokens_per_s": 30.0, "num_compilations_measured": 2, "peak_kv_usage": 0.25, "note": None},
               {"output_tokens_per_s": 20.0, "num_compilations_measured": 0, "peak_kv_usage": 0.75, "note": None}]
    merged = median_of_repeats(repeats)
    assert merged == {"output_tokens_per_s": 20.0, "num_compilations_measured": 2, "peak_kv_usage": 0.75,
                      "note": None}
    with pytest.raises(ValueError, match="repeats"):
        median_of_repeats([])
