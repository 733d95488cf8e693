"""Each kernel of a W1 step (SmolLM2-135M) against this CPU's register-only peak and against the same run's roofline
rates: the packed float32 / bfloat16 matmuls per projection (q, k, v fused; o; gate, up fused; down; the vocabulary
projection), decode and prefill attention, at a decode step's 64 rows and a prefill chunk's 512.

Run: .venv/bin/python -m benchmarks.kernels.w1_kernel_table [--repeats 5] [--dtypes float32,bfloat16]

Peak: benchmarks/kernels/fma_peak.cc (independent FMA / VDPBF16PS chains in registers, no loads) on 1 and 2 threads,
the best of 3. Roofline rates: jaxpaged.bench.roofline.measure_rates, as a W1 run measures them (the better of XLA's
dot and the packed matmul on one MLP weight [576, 1536] that stays in cache; the copy bandwidth of numpy). Each
projection row times one jitted call of 30 layers' distinct weights (as a step reads them: from memory at 64 rows),
medians of the repeats; "of roofline dot" is the row's GFLOP/s over the roofline's dot rate at the same rows,
"weights GB/s" the weight bytes each call must read per second (a decode step's memory bound: the copy bandwidth).
"""

import argparse
import pathlib
import statistics
import subprocess
import tempfile
import types
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cpu_decode_attention import time_attention
from jaxpaged.bench.machine_info import machine_info
from jaxpaged.bench.roofline import measure_rates
from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_matmuls
from jaxpaged.timing import call_seconds

HIDDEN, INTER, Q_WIDTH, KV_WIDTH, VOCAB, LAYERS = 576, 1536, 576, 192, 49152, 30
PROJECTIONS = {"qkv": (HIDDEN, (Q_WIDTH, KV_WIDTH, KV_WIDTH)), "o": (Q_WIDTH, (HIDDEN,)),
               "gate_up": (HIDDEN, (INTER, INTER)), "down": (INTER, (HIDDEN,))}
"""name -> (inner, the outer sizes of the weights one native call multiplies)."""
PEAK_SOURCE = pathlib.Path(__file__).with_name("fma_peak.cc")


def register_peak(threads: int) -> dict[str, float]:
    """GFLOP/s of fma_peak on `threads` threads per dtype, the best of 3 runs."""
    with tempfile.TemporaryDirectory() as scratch:
        binary = pathlib.Path(scratch) / "fma_peak"
        subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-pthread", str(PEAK_SOURCE), "-o",
                        str(binary)], check=True)
        best: dict[str, float] = {}
        for _ in range(3):
            for line in subprocess.run([str(binary), str(threads)], capture_output=True, text=True,
                                       check=True).stdout.splitlines():
                name, value = line.split()
                best[name] = max(best.get(name, 0.0), float(value))
    return best


def projection_seconds(name: str, dtype: str, rows: int, repeats: int) -> tuple[float, int, int]:
    """(median seconds of one layer's call, its FLOPs, its weight bytes) for projection `name` over LAYERS layers'
    distinct packed weights, or the vocabulary projection once ("lm_head")."""
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
    seconds = statistics.median(call_seconds(lambda: compiled(x, weights).block_until_ready(), repeats)) / layers
    flops = 2 * rows * inner * sum(outers)
    return seconds, flops, inner * sum(outers) * jnp.dtype(dtype).itemsize


def main() -> None:
    parser = argparse.ArgumentParser(description="W1's kernels against this CPU's peak and the roofline's rates.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    machine = machine_info()
    peaks = {threads: register_peak(threads) for threads in (1, 2)}
    model = cast(Any, types.SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER))
    rates = measure_rates(model, decode_rows=64, prefill_rows=512, repeats=args.repeats)
    print(f"{machine.get('cpu')} ({machine.get('num_cpus')} cpus); register peak GFLOP/s 1 / 2 threads: "
          + ", ".join(f"{d} {peaks[1].get(d, 0):.0f} / {peaks[2].get(d, 0):.0f}" for d in peaks[2])
          + f"; copy {rates.copy_bytes_per_s / 1e9:.1f} GB/s; roofline dot GFLOP/s (64 / 512 rows): "
          + ", ".join(f"{d} {r['decode'] / 1e9:.0f} / {r['prefill'] / 1e9:.0f}"
                      for d, r in rates.dot_flops_per_s.items()))
    print("| dtype | kernel | rows | ms per layer | GFLOP/s | of 2-thread peak | of roofline dot | weights GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        peak = peaks[2].get(dtype, float("nan"))
        for rows, phase in ((64, "decode"), (512, "prefill")):
            for name in (*PROJECTIONS, "lm_head"):
                if name == "lm_head" and rows != 64:
                    continue  # only the sampled rows reach it: at most max_num_seqs = 64
                seconds, flops, weight_bytes = projection_seconds(name, dtype, rows, args.repeats)
                rate = flops / seconds
                print(f"| {dtype} | {name} | {rows} | {seconds * 1e3:.3f} | {rate / 1e9:.0f} | {rate / 1e9 / peak:.0%} | "
                      f"{rate / rates.dot_flops_per_s[dtype][phase]:.0%} | {weight_bytes / seconds / 1e9:.1f} |")
        # Attention: 64 decoding sequences at W1's mean context (~176 tokens), and one 512-token prefill chunk.
        kv_dtype = dtype
        for label, q_lens, kv_lens, tokens in (("decode attention", [1] * 64, [176] * 64, 64),
                                               ("prefill attention", [128] * 4, [128] * 4, 512)):
            seconds = time_attention(q_lens, kv_lens, tokens, layers=LAYERS, repeats=args.repeats, native=True,
                                     kv_dtype=kv_dtype)
            flops = sum(4 * 9 * 64 * (q * (k - q) + q * (q + 1) // 2) for q, k in zip(q_lens, kv_lens))
            kv_bytes = sum(kv_lens) * 2 * 3 * 64 * jnp.dtype(kv_dtype).itemsize
            rate = flops / seconds
            print(f"| {dtype} | {label} | {tokens} | {seconds * 1e3:.3f} | {rate / 1e9:.0f} | {rate / 1e9 / peak:.0%} | "
                  f"{rate / rates.dot_flops_per_s[dtype]['decode' if tokens == 64 else 'prefill']:.0%} | "
                  f"KV {kv_bytes / seconds / 1e9:.1f} |")


if __name__ == "__main__":
    main()
