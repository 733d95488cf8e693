"""Per-request timings -> the sweep's metrics: throughput, and TTFT/TPOT/ITL/E2E percentiles.

Definitions (vLLM's benchmark conventions):
- TTFT: arrival -> first generated token.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request (requests of one output token have none).
- ITL: every gap between two successive token deliveries of one request, pooled over requests.
- E2E: arrival -> last token.
Times are seconds on one clock; metrics are reported in milliseconds.
"""

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Optional

import numpy as np

from jaxpaged.checks import is_number

PERCENTILES = (50, 90, 99)


@dataclasses.dataclass
class RequestTiming:
    """When one request arrived and when its tokens came back."""

    arrival: float
    first_token: float
    finish: float
    num_prompt_tokens: int
    num_output_tokens: int
    token_times: list[float] = dataclasses.field(default_factory=list)
    """When each delivery of tokens reached the client (one per token offline; one per chunk online)."""


def percentile_summary(name: str, values_s: Sequence[float]) -> dict[str, Optional[float]]:
    """{name_ms_p50, name_ms_p90, name_ms_p99, name_ms_mean} in milliseconds (None when there are no values)."""
    if len(values_s) == 0:
        return {**{f"{name}_ms_p{p}": None for p in PERCENTILES}, f"{name}_ms_mean": None}
    values_ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    summary: dict[str, Optional[float]] = {f"{name}_ms_p{p}": float(np.percentile(values_ms, p))
                                           for p in PERCENTILES}
    summary[f"{name}_ms_mean"] = float(values_ms.mean())
    return summary


def latency_metrics(timings: Sequence[RequestTiming]) -> dict[str, Optional[float]]:
    """TTFT, TPOT, ITL and E2E percentiles of a run."""
    ttfts = [t.first_token - t.arrival for t in timings]
    e2es = [t.finish - t.arrival for t in timings]
    tpots = [(t.finish - t.first_token) / (t.num_output_tokens - 1) for t in timings if t.num_output_tokens > 1]
    itls = [later - earlier for t in timings for earlier, later in zip(t.token_times, t.token_times[1:])]
    metrics: dict[str, Optional[float]] = {}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2e", e2es)):
        metrics.update(percentile_summary(name, values))
    return metrics


def throughput_metrics(timings: Sequence[RequestTiming], duration_s: float) -> dict[str, float]:
    """Requests/s and input/output tokens/s over the measured wall time."""
    if duration_s <= 0:
        raise ValueError(f"duration_s: must be > 0, got {duration_s!r}")
    num_input = sum(t.num_prompt_tokens for t in timings)
    num_output = sum(t.num_output_tokens for t in timings)
    return {"num_requests": len(timings), "duration_s": duration_s,
            "total_input_tokens": num_input, "total_output_tokens": num_output,
            "requests_per_s": len(timings) / duration_s, "input_tokens_per_s": num_input / duration_s,
            "output_tokens_per_s": num_output / duration_s}


def run_metrics(timings: Sequence[RequestTiming], duration_s: float) -> dict[str, Optional[float]]:
    """Throughput and latency of one measured run."""
    return {**throughput_metrics(timings, duration_s), **latency_metrics(timings)}


# Counters whose worst repeat is the honest figure (a compile in any repeat is a compile).
_WORST_OF = {"num_compilations_measured": max, "num_preemptions": max, "peak_kv_usage": max}


def median_of_repeats(repeats: Sequence[dict]) -> dict:
    """One metrics dict from several repeats: the median of each number (worst case for counters)."""
    if not repeats:
        raise ValueError("repeats: at least one run is needed")
    merged: dict = {}
    for key in repeats[0]:
        values = [run.get(key) for run in repeats]
        numbers = [v for v in values if is_number(v)]
        if len(numbers) != len(values):
            merged[key] = values[0] if all(v == values[0] for v in values) else None
        elif key in _WORST_OF:
            merged[key] = _WORST_OF[key](numbers)
        else:
            merged[key] = statistics.median(numbers)
    return merged
