"""Each kernel of a W1 step (SmolLM2-135M) against this CPU's register-only peak and against the same run's roofline
rates: the packed float32 / bfloat16 matmuls per projection (q, k, v fused; o; gate, up fused; down; the vocabulary
projection), decode and prefill attention, at a decode step's 64 rows and a prefill chunk's 512.

Run: .venv/bin/python -m benchmarks.kernels.w1_kernel_table [--repeats 5] [--dtypes float32,bfloat16]

Peak: benchmarks/kernels/fma_peak.cc (independent FMA / VDPBF16PS chains in registers, no loads), GFLOP per
CPU-second of one core, the best of 3, times the cores. Roofline rates: jaxpaged.bench.roofline.measure_rates, as a
W1 run measures them (the better of XLA's dot and the packed matmul on one MLP weight [576, 1536] that stays in
cache, the best repeat; the copy bandwidth of numpy). Each projection row times one jitted call of 30 layers'
distinct weights (as a step reads them: from memory at 64 rows), medians of the repeats, by wall time and by the
process's CPU time (x cores: the work's time with the cores to itself, what a shared machine distorts least; it
leaves out threads waiting for each other). "of roofline dot": wall GFLOP/s over the roofline's dot rate at the
same rows; "weights GB/s": the weight bytes each call reads per second (a decode step's memory side).
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import tempfile
import time
import types
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cpu_decode_attention import compile_attention
from jaxpaged.bench.machine_info import machine_info
from jaxpaged.bench.roofline import measure_rates
from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_matmuls

HIDDEN, INTER, Q_WIDTH, KV_WIDTH, VOCAB, LAYERS = 576, 1536, 576, 192, 49152, 30
PROJECTIONS = {"qkv": (HIDDEN, (Q_WIDTH, KV_WIDTH, KV_WIDTH)), "o": (Q_WIDTH, (HIDDEN,)),
               "gate_up": (HIDDEN, (INTER, INTER)), "down": (INTER, (HIDDEN,))}
"""name -> (inner, the outer sizes of the weights one native call multiplies)."""
CORES = os.cpu_count() or 1
"""The cores the kernels' threads share (CPU time / CORES: the wall time of the work alone)."""
PEAK_SOURCE = pathlib.Path(__file__).with_name("fma_peak.cc")


def register_peak() -> dict[str, float]:
    """GFLOP per CPU-second of one core running fma_peak, per dtype, the best of 3 runs (CPU time, not wall time: on a
    shared machine the wall time also counts what other processes ran)."""
    with tempfile.TemporaryDirectory() as scratch:
        binary = pathlib.Path(scratch) / "fma_peak"
        subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-pthread", str(PEAK_SOURCE), "-o",
                        str(binary)], check=True)
        best: dict[str, float] = {}
        for _ in range(3):
            for line in subprocess.run([str(binary), "1"], capture_output=True, text=True,
                                       check=True).stdout.splitlines():
                name, _, per_cpu_second = line.split()
                best[name] = max(best.get(name, 0.0), float(per_cpu_second))
    return best


def projection_seconds(name: str, dtype: str, rows: int, repeats: int) -> tuple[float, float, int, int]:
    """(median wall and process CPU seconds of one layer's call, its FLOPs, its weight bytes) for projection `name`
    over LAYERS layers' distinct packed weights, or the vocabulary projection once ("lm_head")."""
    rng = np.random.default_rng(0)
    if name == "lm_head":
        inner, outers, layers = HIDDEN, (VOCAB,), 1
    else:
        (inner, outers), layers = PROJECTIONS[name], LAYERS
    weights = [[jnp.asarray(pack_panels((rng.standard_normal((inner, outer)) / 30).astype(dtype)))
                for outer in outers] for _ in range(layers)]
    x = jnp.asarray(rng.standard_normal((rows, inner)).astype(dtype))

    def step(x, weights):
        total = jnp.float32(0)
        for layer in weights:
            total = total + sum(out[0, 0].astype(jnp.float32) for out in packed_matmuls(x, layer, out_dtype=x.dtype))
        return total

    compiled = jax.jit(step).lower(x, weights).compile()
    wall, cpu = seconds_of(lambda: compiled(x, weights).block_until_ready(), repeats)
    flops = 2 * rows * inner * sum(outers)
    return wall / layers, cpu / layers, flops, inner * sum(outers) * jnp.dtype(dtype).itemsize


def seconds_of(function, repeats: int) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of `function` over `repeats` calls: on a shared machine CPU time / cores
    is the time the work would take with the cores to itself (it leaves out waiting, so an imbalance between the
    threads shows only in wall time)."""
    walls, cpus = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        function()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - start_cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description="W1's kernels against this CPU's peak and the roofline's rates.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    machine = machine_info()
    per_core = register_peak()
    model = cast(Any, types.SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER))
    rates = measure_rates(model, decode_rows=64, prefill_rows=512, repeats=args.repeats)
    print(f"{machine.get('cpu')} ({machine.get('num_cpus')} cpus); register peak GFLOP per CPU-second of a core: "
          + ", ".join(f"{d} {rate:.1f}" for d, rate in per_core.items())
          + f"; copy {rates.copy_bytes_per_s / 1e9:.1f} GB/s; roofline dot GFLOP/s (64 / 512 rows): "
          + ", ".join(f"{d} {r['decode'] / 1e9:.0f} / {r['prefill'] / 1e9:.0f}"
                      for d, r in rates.dot_flops_per_s.items()))
    print("| dtype | kernel | rows | ms per layer | GFLOP/s | of the cores' peak | of roofline dot | GFLOP per CPU-s "
          "x cores | that of the peak | weights GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        peak = per_core.get(dtype, float("nan")) * CORES  # GFLOP/s of every core at its register peak
        for rows, phase in ((64, "decode"), (512, "prefill")):
            for name in (*PROJECTIONS, "lm_head"):
                if name == "lm_head" and rows != 64:
                    continue  # only the sampled rows reach it: at most max_num_seqs = 64
                seconds, cpu, flops, weight_bytes = projection_seconds(name, dtype, rows, args.repeats)
                rate, cpu_rate = flops / seconds, flops / (cpu / CORES)
                print(f"| {dtype} | {name} | {rows} | {seconds * 1e3:.3f} | {rate / 1e9:.0f} | "
                      f"{rate / 1e9 / peak:.0%} | "
                      f"{rate / rates.dot_flops_per_s[dtype][phase]:.0%} | {cpu_rate / 1e9:.0f} | "
                      f"{cpu_rate / 1e9 / peak:.0%} | "
                      f"{weight_bytes / seconds / 1e9:.1f} |", flush=True)
        # Attention: 64 decoding sequences at W1's mean context (~176 tokens), and one 512-token prefill chunk.
        kv_dtype = dtype
        for label, q_lens, kv_lens, tokens in (("decode attention", [1] * 64, [176] * 64, 64),
                                               ("prefill attention", [128] * 4, [128] * 4, 512)):
            call = compile_attention(q_lens, kv_lens, tokens, layers=LAYERS, native=True, kv_dtype=kv_dtype)
            seconds, cpu = (value / LAYERS for value in seconds_of(call, args.repeats))
            flops = sum(4 * 9 * 64 * (q * (k - q) + q * (q + 1) // 2) for q, k in zip(q_lens, kv_lens))
            kv_bytes = sum(kv_lens) * 2 * 3 * 64 * jnp.dtype(kv_dtype).itemsize
            rate, cpu_rate = flops / seconds, flops / (cpu / CORES)
            print(f"| {dtype} | {label} | {tokens} | {seconds * 1e3:.3f} | {rate / 1e9:.0f} | "
                  f"{rate / 1e9 / peak:.0%} | "
                  f"{rate / rates.dot_flops_per_s[dtype]['decode' if tokens == 64 else 'prefill']:.0%} | "
                  f"{cpu_rate / 1e9:.0f} | {cpu_rate / 1e9 / peak:.0%} | KV {kv_bytes / seconds / 1e9:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
