"""`jaxpaged bench CONFIG`: run every sweep point and every peer, then write JSON, markdown and PNGs.

Points that share engine options share one engine (offline) or one server (online), built once (unless a point
asks for a fresh engine: a restart); between runs the prefix cache is reset (offline) or salted apart (online), so
no run hits blocks a previous run left (except on a disk KV tier, which persists by design). Engine option strings
may name "{scratch}": a directory under the run's output, emptied when the sweep starts (for disk KV tiers).
Peers run once per distinct workload, after jaxpaged, on the same requests; the alternating peers (vllm_cpu,
paired_peers.py) run between jaxpaged's repeats instead.
"""

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import pathlib
import shutil
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Optional

from tqdm.auto import tqdm

from jaxpaged.bench.bench_config import BenchConfig, SweepPoint, load_config
from jaxpaged.bench.kv_baseline import RESERVATIONS, contiguous_baseline
from jaxpaged.bench.latency_stats import median_of_repeats
from jaxpaged.bench.machine_info import git_state, load_average, machine_info, package_versions
from jaxpaged.bench.paired_peers import PairedPeers
from jaxpaged.bench.random_models import is_random_model, materialize
from jaxpaged.bench.workloads import BenchRequest, generate_requests, workload_kind
from jaxpaged.config import EngineConfig

if TYPE_CHECKING:
    from jaxpaged.bench.roofline import MachineRates


def workload_key(point: SweepPoint) -> str:
    """Identifies the requests and sampling of a point, and online their arrivals (rows with equal keys ran the same
    work)."""
    arrivals = ({"request_rate": str(point.mode.request_rate), "max_concurrency": point.mode.max_concurrency,
                 "arrival_seed": point.mode.arrival_seed} if point.mode.kind == "online" else {})
    return json.dumps({"kind": workload_kind(point.workload), **dataclasses.asdict(point.workload),
                       **dataclasses.asdict(point.sampling), **arrivals}, sort_keys=True)


def _row(system: str, kind: str, point_values: dict, key: str, metrics: dict, repeats: list[dict],
         status: str = "ok", error: Optional[str] = None) -> dict:
    return {"system": system, "kind": kind, "point": point_values, "workload_key": key, "status": status,
            "error": error, "metrics": metrics, "repeats": repeats}


def _failed_row(system: str, kind: str, point_values: dict, key: str, error: BaseException, status: str) -> dict:
    message = f"{type(error).__name__}: {error}"
    if status == "failed":
        print(f"\n[bench] {system} at {point_values or 'the only point'} failed:\n{traceback.format_exc()}",
              file=sys.stderr)
    return _row(system, kind, point_values, key, {}, [], status, message)


def _kv_baselines(engine, requests: list[BenchRequest]) -> dict:
    """The contiguous-reservation figures on the same trace and the same token capacity as the paged pool."""
    block_size = engine.config.cache.block_size
    capacity = (engine.runner.num_kv_blocks - 1) * block_size  # block 0 is the null block
    sched = engine.config.scheduler
    prompt_lens = [len(r.prompt_token_ids) for r in requests]
    output_lens = [r.max_tokens for r in requests]
    figures = {"kv_capacity_tokens": capacity}
    for reservation in RESERVATIONS:
        result = contiguous_baseline(prompt_lens, output_lens, capacity, sched.max_model_len, sched.max_num_seqs,
                                     reservation)
        figures[f"contiguous_{reservation}_max_concurrent"] = result.max_concurrent_requests
        figures[f"contiguous_{reservation}_kv_utilization"] = result.kv_utilization_mean
    return figures


SCRATCH = "{scratch}"


def scratch_dir(out_dir: pathlib.Path) -> pathlib.Path:
    """The run's scratch directory, for what engine options name by SCRATCH."""
    return out_dir / "scratch"


def resolve_scratch(engine_options: dict, out_dir: pathlib.Path) -> dict:
    """The options with SCRATCH in string values replaced by the run's scratch directory."""
    scratch = str(scratch_dir(out_dir))
    return {key: value.replace(SCRATCH, scratch) if isinstance(value, str) else value
            for key, value in engine_options.items()}


def _offline_group(config: BenchConfig, points: list[SweepPoint], indices: list[int], rows: dict, bar,
                   info: dict, out_dir: pathlib.Path, paired: "PairedPeers") -> None:
    from jaxpaged.bench.offline_runner import build_llm, run_offline, warm_up_llm

    llm, startup_s = build_llm(config.model, resolve_scratch(points[indices[0]].engine_options, out_dir))
    info.setdefault("model_name", llm.engine.model_name)
    info.setdefault("model_config", llm.engine.runner.model_config)
    dtype = str(llm.engine.runner.dtype)
    # The KV format decides how many tokens the pool holds: rows of different formats are different systems.
    kv_format = {"kv_cache_dtype": llm.engine.config.cache.kv_cache_dtype,
                 "kv_bytes_per_token": llm.engine.runner.memory_plan.kv_bytes_per_token,
                 "quantization": llm.engine.runner.plan.quantization}
    try:
        first = points[indices[0]]
        warm_up_llm(llm, generate_requests(first.workload), first.sampling, first.mode.warmup_requests)
        for index in indices:
            point = points[index]
            requests = generate_requests(point.workload)
            try:
                repeats = paired.run_offline(
                    workload_key(point), requests, point.sampling, point.mode.repeats, dtype,
                    lambda tokens_out, p=point, r=requests, m=llm: run_offline(m, r, p.sampling, p.mode, tokens_out))
                metrics = {**median_of_repeats(repeats), "engine_startup_s": startup_s, "dtype": dtype, **kv_format}
                if point.mode.track_kv_utilization:
                    metrics.update(_kv_baselines(llm.engine, requests))
                rows[index] = _row("jaxpaged", "jaxpaged", point.values, workload_key(point), metrics, repeats)
            except Exception as error:  # one broken point must not lose the rest of the sweep
                rows[index] = _failed_row("jaxpaged", "jaxpaged", point.values, workload_key(point), error, "failed")
            bar.update(1)
    finally:
        llm.close()  # persists a disk KV tier, as a server's shutdown does
        del llm
        gc.collect()


def _online_group(config: BenchConfig, points: list[SweepPoint], indices: list[int], rows: dict, bar, info: dict,
                  out_dir: pathlib.Path, paired: "PairedPeers") -> None:
    from jaxpaged.bench.online_runner import run_online, warm_up_server
    from jaxpaged.bench.server_process import ServerProcess

    first = points[indices[0]]
    log_path = out_dir / f"server-{indices[0]}.log"
    options = resolve_scratch(first.engine_options, out_dir)
    with ServerProcess(config.model, options, log_path, first.mode.server_start_timeout_s) as server:
        warm_up_server(server, first.mode.warmup_requests, first.sampling)
        for index in indices:
            point = points[index]
            requests = generate_requests(point.workload)
            try:
                salt = f"{config.name}-{index}"
                repeats = paired.run_online(
                    workload_key(point), requests, point,
                    lambda r, p=point, q=requests, s=salt: run_online(server, q, p.sampling, p.mode, f"{s}-{r}"), salt)
                rows[index] = _row("jaxpaged", "jaxpaged", point.values, workload_key(point),
                                   median_of_repeats(repeats), repeats)
            except Exception as error:
                rows[index] = _failed_row("jaxpaged", "jaxpaged", point.values, workload_key(point), error, "failed")
            bar.update(1)


def _engine_groups(points: list[SweepPoint]) -> list[list[int]]:
    """Point indices sharing engine options (and mode kind), in order of first appearance; a point that asks for
    a fresh engine gets one of its own."""
    groups: dict[str, list[int]] = {}
    for index, point in enumerate(points):
        key = json.dumps([point.mode.kind, point.engine_options, index if point.mode.fresh_engine else None],
                         sort_keys=True)
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def _run_jaxpaged(config: BenchConfig, points: list[SweepPoint], out_dir: pathlib.Path, bar, info: dict,
                  paired: "PairedPeers") -> list:
    rows: dict[int, dict] = {}
    groups = _engine_groups(points)
    for number, indices in enumerate(groups):
        later_dtypes = {points[group[0]].engine_options.get("dtype", "auto") for group in groups[number:]}
        # peers in a dtype no group from here on runs in let their gigabytes go ("auto" may be any dtype)
        paired.release(lambda peer, dtypes=later_dtypes: "auto" not in dtypes and peer.dtype not in dtypes)
        try:
            if points[indices[0]].mode.kind == "offline":
                _offline_group(config, points, indices, rows, bar, info, out_dir, paired)
            else:
                _online_group(config, points, indices, rows, bar, info, out_dir, paired)
        except Exception as error:  # the engine or server did not start: every point of the group fails
            for index in indices:
                if index not in rows:
                    rows[index] = _failed_row("jaxpaged", "jaxpaged", points[index].values,
                                              workload_key(points[index]), error, "failed")
                    bar.update(1)
    return [rows[index] for index in range(len(points))]


def _peer_workloads(config: BenchConfig, points: list[SweepPoint]) -> list[SweepPoint]:
    """One point per distinct workload (peers do not depend on engine options)."""
    seen: dict[str, SweepPoint] = {}
    for point in points:
        seen.setdefault(workload_key(point), point)
    return list(seen.values()) if config.peers else []


def _run_peers(config: BenchConfig, points: list[SweepPoint], bar, paired: "PairedPeers") -> list[dict]:
    from jaxpaged.bench.paired_peers import PAIRED_KINDS
    from jaxpaged.bench.peers import PeerUnavailable
    from jaxpaged.bench.peers.dispatch import PeerModels, measure_peer

    models = PeerModels(config.model)
    rows = []
    for point in _peer_workloads(config, points):
        prefixes = ("workload.", "sampling.") + (("mode.",) if point.mode.kind == "online" else ())  # arrivals
        values = {k: v for k, v in point.values.items() if k.startswith(prefixes)}
        requests = generate_requests(point.workload)
        for peer in config.peers:
            key = workload_key(point)
            try:
                metrics, repeats = (paired.result(peer, point, requests, key) if peer.kind in PAIRED_KINDS
                                    else measure_peer(peer, models, requests, point.sampling))
                rows.append(_row(peer.name, peer.kind, values, key, metrics, repeats))
            except PeerUnavailable as error:
                rows.append(_failed_row(peer.name, peer.kind, values, key, error, "unavailable"))
            except Exception as error:  # PeerFailure or anything else: the peer's failure is its result
                rows.append(_failed_row(peer.name, peer.kind, values, key, error, "failed"))
            bar.update(1)
    return rows


def _step_rows(points: list[SweepPoint]) -> tuple[int, int]:
    """The sweep's largest decode rows (max_num_seqs) and prefill rows (max_num_batched_tokens)."""
    schedulers = [EngineConfig.from_options(**point.engine_options).scheduler for point in points]
    return (max(scheduler.max_num_seqs for scheduler in schedulers),
            max(scheduler.max_num_batched_tokens for scheduler in schedulers))


def _measure_rates(model_config, step_rows: tuple[int, int]) -> "MachineRates":
    """The machine's rates at the sweep's step shapes (decode rows, prefill rows)."""
    from jaxpaged.bench.roofline import measure_rates

    return measure_rates(model_config, decode_rows=step_rows[0], prefill_rows=step_rows[1])


def _add_roofline(rates: "MachineRates", step_rows: tuple[int, int], points: list[SweepPoint], rows: list[dict],
                  model_config) -> dict:
    """Give every measured row its workload's lower bound under `rates` and the fraction of it the row achieved; the
    rates, as the run records them."""
    from jaxpaged.bench.roofline import lower_bound_seconds

    decode_rows, prefill_rows = step_rows
    requests_of = {workload_key(point): generate_requests(point.workload) for point in points}
    for row in rows:
        requests = requests_of.get(row["workload_key"])
        duration = row["metrics"].get("duration_s")
        if row["status"] != "ok" or not requests or not duration:
            continue
        # The bound is the machine's, not a system's: every request batched at once, in the row's dtype.
        bound = lower_bound_seconds(model_config, requests, rates, row["metrics"].get("dtype", "float32"),
                                    max_num_seqs=len(requests), quantization=row["metrics"].get("quantization"))
        row["metrics"].update(bound)
        row["metrics"]["roofline_fraction"] = bound["roofline_s"] / duration
    return {"copy_gb_per_s": rates.copy_bytes_per_s / 1e9,
            "dot_gflop_per_s": {dtype: {phase: rate / 1e9 for phase, rate in phases.items()}
                                for dtype, phases in rates.dot_flops_per_s.items()},
            "shapes": {"decode_rows": decode_rows, "prefill_rows": prefill_rows,
                       "hidden": model_config.hidden_size, "intermediate": model_config.intermediate_size}}


def run_sweep(config: BenchConfig, out_dir: pathlib.Path, *, progress: bool = True) -> dict:
    """Run the whole sweep; the run as a JSON-ready dict (targets evaluated, nothing written yet)."""
    from jaxpaged.bench.targets import evaluate_targets

    started = datetime.now(UTC)
    start = time.perf_counter()
    machine = machine_info()
    points = config.points()
    num_units = len(points) + len(_peer_workloads(config, points)) * len(config.peers) + int(config.warmup_probe)
    info: dict = {}
    shutil.rmtree(scratch_dir(out_dir), ignore_errors=True)
    paired = PairedPeers(config, out_dir)
    with tqdm(total=num_units, desc=f"bench {config.name}", unit="run", dynamic_ncols=True,
              disable=not progress) as bar, contextlib.closing(paired):
        rows = _run_jaxpaged(config, points, out_dir, bar, info, paired)
        # The roofline needs the model a jaxpaged row loaded. Its rates are measured before and after the peers, at
        # the sweep's largest step shapes, and the better of each counts (MachineRates.best_of).
        model_config = info.get("model_config")
        step_rows = _step_rows(points) if config.roofline and model_config is not None else None
        rates = _measure_rates(model_config, step_rows) if step_rows is not None else None
        rows += _run_peers(config, points, bar, paired)
        paired.close()  # the peers' processes end before the roofline measures the machine again
        roofline = None
        if rates is not None and step_rows is not None:
            rates = rates.best_of(_measure_rates(model_config, step_rows))
            roofline = _add_roofline(rates, step_rows, points, rows, model_config)
        probe = None
        if config.warmup_probe:
            from jaxpaged.bench.warmup_probe import probe_cold_and_warm

            try:
                probe = probe_cold_and_warm(config.model, points[0].engine_options)
            except Exception as error:
                probe = {"error": f"{type(error).__name__}: {error}"}
            bar.update(1)
    return {"config_name": config.name, "description": config.description, "config": config.raw,
            "started_at": started.isoformat(timespec="seconds"), "duration_s": time.perf_counter() - start,
            "machine": machine, "load_average_end": load_average(), "packages": package_versions(),
            "git": git_state(), "model_name": info.get("model_name", config.model or "SmolLM2-135M-Instruct"),
            "rows": rows, "warmup_probe": probe, "roofline": roofline,
            "targets": evaluate_targets(config.targets, rows)}


def write_run(run: dict, config: BenchConfig, out_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """JSON, PNGs and markdown of a run under out_dir; their paths."""
    from jaxpaged.bench.plots import write_plots
    from jaxpaged.bench.results_writer import write_json, write_markdown

    x_axis = config.plot_x or next(iter(config.sweep), None)
    plots = write_plots(run, out_dir, x_axis)
    run["plots"] = [str(path) for path in plots]
    paths = {"json": write_json(run, out_dir / f"{config.name}.json"),
             "markdown": write_markdown(run, out_dir / f"{config.name}.md")}
    paths.update({path.stem: path for path in plots})
    return paths


def use_cpu_devices(count: int) -> None:
    """Forces `count` CPU devices here and in the server processes the sweep starts (before JAX starts)."""
    import jax

    os.environ["JAX_NUM_CPU_DEVICES"] = str(count)
    jax.config.update("jax_num_cpu_devices", count)


def bench_main(args: argparse.Namespace) -> int:
    """The `jaxpaged bench` command: args.config (YAML path), args.out (results root, default "results")."""
    config = load_config(args.config)
    if is_random_model(config.model):  # made once, then read from the cache like any HF directory
        from jaxpaged.weights.loader import cache_root

        config = dataclasses.replace(config, model=materialize(str(config.model), cache_root() / "random-models"))
    if config.cpu_devices is not None:
        use_cpu_devices(config.cpu_devices)
    out_dir = pathlib.Path(getattr(args, "out", None) or "results") / config.name
    run = run_sweep(config, out_dir)
    paths = write_run(run, config, out_dir)
    print((out_dir / f"{config.name}.md").read_text())
    print("wrote " + ", ".join(str(path) for path in paths.values()))
    broken = [row for row in run["rows"] if row["kind"] == "jaxpaged" and row["status"] != "ok"]
    return 1 if broken else 0
