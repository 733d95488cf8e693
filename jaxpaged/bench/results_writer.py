"""Writing a run: one JSON file with everything, and a markdown table of the figures that matter."""

import json
import math
import pathlib
from typing import Optional

from jaxpaged.bench.machine_info import describe_machine
from jaxpaged.bench.roofline import REPEATS as ROOFLINE_REPEATS

NOISE_NOTE = ("Tokens/s on a shared machine are noisy: other jobs share the CPU cores (load averages above). "
              "Ratios against a peer are measured in the same run; medians of repeats where repeats > 1.")


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan; "inf" reads back unambiguously
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(run: dict, path: pathlib.Path) -> pathlib.Path:
    """The whole run (config, machine, versions, every row and repeat) as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_safe(run), indent=1, sort_keys=False) + "\n")
    return path


def fmt(value, digits: int = 3) -> str:
    """A table cell: '–' for missing, integers as is, floats to a few significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return lines + [""]


def _axis_cells(row: dict, axes: list[str]) -> list[str]:
    return [fmt(row["point"].get(axis)) if axis in row["point"] else "–" for axis in axes]


def peer_ratios(row: dict, rows: list[dict], metric: str = "output_tokens_per_s") -> dict[str, Optional[float]]:
    """jaxpaged's metric over each peer's, on the same workload in the same dtype (no ratio across precisions)."""
    ratios = {}
    mine = row["metrics"].get(metric)
    dtype = row["metrics"].get("dtype", "float32")
    for peer in rows:
        if peer["kind"] == "jaxpaged" or peer["workload_key"] != row["workload_key"]:
            continue
        same_dtype = peer["metrics"].get("dtype", "float32") == dtype
        theirs = peer["metrics"].get(metric) if peer["status"] == "ok" and same_dtype else None
        ratios[peer["system"]] = mine / theirs if mine and theirs else None
    return ratios


def _throughput_section(rows: list[dict], axes: list[str]) -> list[str]:
    peers = sorted({row["system"] for row in rows if row["kind"] != "jaxpaged"})
    with_roofline = any("roofline_fraction" in row["metrics"] for row in rows)
    header = ["system", *axes, "req/s", "input tok/s", "output tok/s", *[f"× {p}" for p in peers],
              *(["dtype", "of roofline"] if with_roofline else [])]
    body = []
    for row in rows:
        m = row["metrics"]
        ratios = peer_ratios(row, rows) if row["kind"] == "jaxpaged" else {}
        status = "" if row["status"] == "ok" else f" ({row['status']}: {row.get('error')})"
        body.append([row["system"] + status, *_axis_cells(row, axes), fmt(m.get("requests_per_s")),
                     fmt(m.get("input_tokens_per_s")), fmt(m.get("output_tokens_per_s")),
                     *[fmt(ratios.get(p)) + ("×" if ratios.get(p) else "") for p in peers],
                     *([m.get("dtype", "float32"), _pct(m.get("roofline_fraction"))] if with_roofline else [])])
    return ["### Throughput", ""] + _table(header, body)


def _agreement_section(rows: list[dict], axes: list[str]) -> list[str]:
    """Peers whose greedy tokens were compared with jaxpaged's in the same dtype (paired_peers.py)."""
    compared = [row for row in rows if "greedy_positions_identical" in row["metrics"]]
    if not compared:
        return []
    body = [[row["system"], *_axis_cells(row, axes), row["metrics"].get("dtype", "float32"),
             _pct(row["metrics"]["greedy_positions_identical"]), _pct(row["metrics"]["greedy_prompts_identical"])]
            for row in compared]
    return (["### Greedy agreement with jaxpaged", "",
             "Each peer's first run against jaxpaged's first run of the same requests in the same dtype, position by "
             "position; a prompt counts as identical when its whole output is.", ""]
            + _table(["system", *axes, "dtype", "positions identical", "prompts identical"], body))


def _roofline_section(roofline: Optional[dict]) -> list[str]:
    """The machine's measured rates behind the "of roofline" column."""
    if not roofline:
        return []
    dots = roofline["dot_gflop_per_s"]
    shapes = roofline["shapes"]
    lines = ["### Roofline", "",
             f"Measured in this run (the best of {ROOFLINE_REPEATS} repeats each, after jaxpaged's runs and again "
             f"after the peers', the better of the two): "
             f"numpy copy {roofline['copy_gb_per_s']:.2f} GB/s (bytes copied per second, "
             f"256 MiB); dot [rows, {shapes['hidden']}] x [{shapes['hidden']}, {shapes['intermediate']}] at "
             f"{shapes['decode_rows']} / {shapes['prefill_rows']} rows: float32 {dots['float32']['decode']:.0f} / "
             f"{dots['float32']['prefill']:.0f} GFLOP/s, bfloat16 inputs with float32 accumulation "
             f"{dots['bfloat16']['decode']:.0f} / {dots['bfloat16']['prefill']:.0f} GFLOP/s"
             + (f", int8 x int8 with int32 sums {dots['int8']['decode']:.0f} / {dots['int8']['prefill']:.0f} "
                "GOP/s (the int8 roofline of rows with int8 projections)" if "int8" in dots else "") + ".",
             "The workload's lower bound: prefill FLOPs at the prefill dot rate, plus for the decode the larger of its "
             "FLOPs at the decode dot rate and its bytes (every weight once per step, every KV byte attended) at the "
             "copy bandwidth, all requests batched at once; \"of roofline\" is that bound over a row's duration.", ""]
    return lines


def _latency_section(rows: list[dict], axes: list[str]) -> list[str]:
    columns = [("TTFT p50", "ttft_ms_p50"), ("TTFT p90", "ttft_ms_p90"), ("TTFT p99", "ttft_ms_p99"),
               ("TPOT p50", "tpot_ms_p50"), ("TPOT p99", "tpot_ms_p99"), ("ITL p50", "itl_ms_p50"),
               ("ITL p90", "itl_ms_p90"), ("ITL p99", "itl_ms_p99"), ("E2E p50", "e2e_ms_p50"),
               ("E2E p99", "e2e_ms_p99")]
    body = [[row["system"], *_axis_cells(row, axes), *[fmt(row["metrics"].get(key)) for _, key in columns]]
            for row in rows if row["status"] == "ok"]
    return ["### Latency (ms)", ""] + _table(["system", *axes, *[name for name, _ in columns]], body)


def _engine_section(rows: list[dict], axes: list[str]) -> list[str]:
    header = ["system", *axes, "peak KV usage", "prefix-cache hits", "missed reusable", "preemptions",
              "compilations (measured)",
              "warm-up s", "start-up s", "step ms p50", "host ms/step p50", "exposed host ms/step p50",
              "scheduler ms/step p50"]
    body = []
    for row in rows:
        if row["kind"] != "jaxpaged" or row["status"] != "ok":
            continue
        m = row["metrics"]
        body.append([row["system"], *_axis_cells(row, axes), _pct(m.get("peak_kv_usage")),
                     _pct(m.get("prefix_cache_hit_rate")), _pct(m.get("prefix_cache_missed_reusable_rate")),
                     fmt(m.get("num_preemptions")),
                     fmt(m.get("num_compilations_measured")), fmt(m.get("warmup_s")),
                     fmt(m.get("engine_startup_s", m.get("server_startup_s"))), fmt(m.get("step_ms_p50")),
                     fmt(m.get("host_ms_per_step_p50")), fmt(m.get("exposed_host_ms_per_step_p50")),
                     fmt(m.get("scheduler_ms_per_step_p50"))])
    legend = ("prefix-cache hits and missed reusable: shares of the prompt tokens looked up that the cache served, "
              "and that it had seen but could not serve because the prompt diverged earlier (the advisor's "
              "counter); "
              "warm-up: compiling every bucket in the engine's process; start-up: load + warm-up (offline) or "
              "spawn to a healthy /health (online); compilations: XLA executables built during the measured runs "
              "(persistent-cache loads count too); "
              "host ms/step: schedule + batch padding + token update + output processing, beside the wall time "
              "of a whole step; exposed: the same, counted 0 in steps where async scheduling launched the next "
              "step while the device still computed this one (the host worked beside the device); "
              "online rows have no per-step figures (the engine runs in the server process).")
    return ["### Engine", ""] + _table(header, body) + [legend, ""] if body else []


def _gib(num_bytes: Optional[float]) -> str:
    return "–" if num_bytes is None else fmt(num_bytes / 2**30)


def _kv_tiers_section(rows: list[dict], axes: list[str]) -> list[str]:
    """Where the prefix hits came from, what moved between the tiers, and TTFT of the revisiting rounds."""
    if not any("ttft_ms_p50_after_round_1" in row["metrics"] or "host_tier_hit_rate" in row["metrics"]
               or "disk_tier_hit_rate" in row["metrics"] for row in rows):
        return []
    body = []
    for row in rows:
        m = row["metrics"]
        if row["kind"] != "jaxpaged" or row["status"] != "ok" or "prefix_cache_hit_rate" not in m:
            continue
        body.append([row["system"], *_axis_cells(row, axes), _pct(m.get("prefix_cache_hit_rate")),
                     *[_pct(m[f"{tier}_tier_hit_rate"]) if f"{tier}_tier_hit_rate" in m else "–"
                       for tier in ("device", "host", "disk")],
                     _gib(m.get("tier_bytes_offloaded")), _gib(m.get("tier_bytes_loaded")),
                     fmt(m.get("ttft_ms_p50_after_round_1"))])
    header = ["system", *axes, "prefix-cache hits", "from device", "from host", "from disk", "GiB offloaded",
              "GiB loaded", "TTFT p50 after round 1 (ms)"]
    legend = ("hits: shares of the prompt tokens looked up, in all and per KV tier they came from (– : tier off); "
              "offloaded: K/V copied from the device pool to the tiers below it; loaded: read back towards the "
              "device; TTFT after round 1: requests of the later rounds only (revisits, follow-up turns).")
    return ["### KV tiers", ""] + _table(header, body) + [legend, ""]


def _kv_section(rows: list[dict], axes: list[str]) -> list[str]:
    body = []
    for row in rows:
        m = row["metrics"]
        if row["kind"] != "jaxpaged" or m.get("kv_utilization_mean") is None:
            continue
        body.append([row["system"], *_axis_cells(row, axes), fmt(m.get("kv_capacity_tokens")),
                     fmt(m.get("max_concurrent_requests")), _pct(m.get("kv_utilization_mean")),
                     _pct(m.get("kv_utilization_at_peak")), fmt(m.get("contiguous_max_model_len_max_concurrent")),
                     _pct(m.get("contiguous_max_model_len_kv_utilization")),
                     fmt(m.get("contiguous_request_max_concurrent")),
                     _pct(m.get("contiguous_request_kv_utilization"))])
    header = ["system", *axes, "KV capacity (tokens)", "paged: max concurrent", "paged: KV utilization",
              "paged: at peak", "contiguous max_model_len: max concurrent", "utilization",
              "contiguous prompt+max_tokens: max concurrent", "utilization"]
    return ["### KV utilization at a fixed KV memory", ""] + _table(header, body) if body else []


def _warmup_section(probe: Optional[dict]) -> list[str]:
    if not probe:
        return []
    if "error" in probe:
        return ["### Warm-up (fresh processes)", "", f"failed: {probe['error']}", ""]
    body = [[name, fmt(probe[name].get("startup_s")), fmt(probe[name].get("warmup_s")),
             fmt(probe[name].get("num_compilations"))] for name in ("cold", "warm")]
    return (["### Warm-up (fresh processes)", "",
             "cold: empty persistent compilation cache; warm: a second process on the cache the first one filled.",
             ""] + _table(["start", "load + compile s", "warm-up s", "compilations"], body))


def _targets_section(targets: list[dict]) -> list[str]:
    if not targets:
        return []
    lines = ["### Targets", ""]
    for target in targets:
        mark = {True: "met", False: "MISSED", None: "not measured"}[target["passed"]]
        lines.append(f"- **{mark}** — {target['name']}: {fmt(target['value'])} (target {target['bound']}; "
                     f"{target['detail']})")
    return lines + [""]


def render_markdown(run: dict) -> str:
    """The run's tables: throughput (with ratios to peers), latency, engine, KV, warm-up, targets."""
    rows = run["rows"]
    axes = list(run["config"].get("sweep") or {})
    machine = run["machine"]
    lines = [f"## {run['config_name']}", ""]
    if run.get("description"):
        lines += [run["description"], ""]
    lines += [f"Run {run['started_at']} on {describe_machine(machine)}; load average at start "
              f"{machine.get('load_average')}, at end {run.get('load_average_end')}. "
              f"Model: {run['model_name']}. {NOISE_NOTE}", ""]
    for section in (_throughput_section(rows, axes), _agreement_section(rows, axes),
                    _roofline_section(run.get("roofline")),
                    _latency_section(rows, axes), _engine_section(rows, axes),
                    _kv_tiers_section(rows, axes), _kv_section(rows, axes), _warmup_section(run.get("warmup_probe")),
                    _targets_section(run.get("targets", []))):
        lines += section
    if run.get("plots"):
        lines += ["### Plots", ""] + [f"![{pathlib.Path(p).stem}]({pathlib.Path(p).name})" for p in run["plots"]]
        lines.append("")
    return "\n".join(lines)


def write_markdown(run: dict, path: pathlib.Path) -> pathlib.Path:
    """The markdown tables next to the JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_markdown(run))
    return path
