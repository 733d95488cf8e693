"""The native CPU grouped matmul (jaxpaged/kernels/cpu_native/grouped_matmul) against XLA's two ways of running a
mixture-of-experts layer's expert matmul on the CPU, at Qwen3-30B-A3B's expert shape, measured in the same run.

Run: PYTHONPATH=. .venv/bin/python -m benchmarks.kernels.cpu_grouped_matmul [--experts 64] [--repeats 7]

One expert matrix per layer, [experts, hidden 2048, width 768] (Qwen3-30B-A3B's gate or up projection; 128 experts
there, fewer here by default to keep the weights' memory small on a shared machine: each call reads only the experts
it touches, so the figures per touched expert do not depend on the count), top 8 of the experts per token, chosen at
random, at 1, 8 and 64 tokens (decode) and 512 (a prefill). Paths:
  - native: grouped_matmul_cpu, float32, bfloat16 and int8 (with scales) weights, as stored [E, in, out];
  - native, panels: grouped_matmul_cpu_panels on the same weights packed once by pack_expert_panels;
  - ragged_dot: jax.lax.ragged_dot, which XLA:CPU lowers to a dense dot over every expert, masked;
  - gather + einsum: each row's expert weight gathered ([rows, hidden, width]) and a batched matvec: reads one expert
    per row, a touched expert as often as rows route to it (skipped where the gathered copy would pass 2 GiB);
  - dense dot: every row times one expert's weight (XLA's dot): the same multiply-adds, one weight; the compute
    rate a prefill could reach, not an MoE path.
The figure that matters for decode is the bandwidth achieved on the touched experts' bytes (each non-empty group's
weight once): bytes / median seconds, and its ratio to a plain read of as many bytes (numpy sums over as many whole
experts, two threads), timed in alternating rounds with the native kernel in both layouts so that all three see the
same load: the roofline ratio, 1.0 being as fast as reading those bytes. Each call routes anew (8 routings, cycled)
and each read takes the next run of experts, so the bytes come from memory, not from the cache a previous call
left. Medians; prints the CPU, a numpy copy's bandwidth and the load average, and a JSON line at the end.
"""

import argparse
import concurrent.futures
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.bench.machine_info import load_average, machine_info
from jaxpaged.bench.roofline import copy_bytes_per_s
from jaxpaged.kernels.cpu_native.grouped_matmul import (
    grouped_matmul_available,
    grouped_matmul_cpu,
    grouped_matmul_cpu_panels,
    pack_expert_panels,
)
from jaxpaged.timing import call_seconds

HIDDEN, WIDTH, TOP_K = 2048, 768, 8
TOKENS = (1, 8, 64, 512)
ROUTINGS = 8
GATHER_LIMIT_BYTES = 2 * 2**30
ROUNDS = 3
"""Alternating rounds of the native kernel and the plain read."""


def routings(rng, tokens: int, experts: int) -> list[np.ndarray]:
    """ROUTINGS group-size vectors: each token's top-k experts drawn at random without repeats."""
    sizes = []
    for _ in range(ROUTINGS):
        chosen = np.stack([rng.choice(experts, TOP_K, replace=False) for _ in range(tokens)])
        sizes.append(np.bincount(chosen.ravel(), minlength=experts).astype(np.int32))
    return sizes


def seconds_each(path, calls: list[tuple], repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `path`, each on the next of `calls`' operands in turn."""
    turn = iter(range(10**9))
    return call_seconds(lambda: path(*calls[next(turn) % len(calls)]).block_until_ready(), repeats)


class ExpertReads:
    """A plain read of `count` whole experts' bytes (as uint64, summed by numpy on two threads: XLA's sum over a
    slice ran at a few percent of memory's rate), the next run of experts each call."""

    def __init__(self, weights: np.ndarray, count: int):
        self.words, self.count, self.calls = weights.reshape(weights.shape[0], -1).view(np.uint64), count, 0

    def block_until_ready(self) -> None:
        first = (self.calls * self.count) % (self.words.shape[0] - self.count + 1)
        self.calls += 1
        words = self.words[first:first + self.count].reshape(-1)
        list(READERS.map(np.add.reduce, (words[:words.shape[0] // 2], words[words.shape[0] // 2:])))


READERS = concurrent.futures.ThreadPoolExecutor(2)


def gather_einsum(lhs, rhs, group_sizes):
    """Each row's expert weight gathered, then one matvec per row (rows past the groups use expert 0, zeroed)."""
    rows = lhs.shape[0]
    expert_of_row = jnp.repeat(jnp.arange(rhs.shape[0]), group_sizes, total_repeat_length=rows)
    real = jnp.arange(rows) < jnp.sum(group_sizes)
    product = jnp.einsum("mk,mkn->mn", lhs, rhs[expert_of_row], preferred_element_type=jnp.float32)
    return jnp.where(real[:, None], product, 0.0).astype(lhs.dtype)


def ragged(lhs, rhs, group_sizes):
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32).astype(lhs.dtype)


def dense_dot(lhs, rhs, group_sizes):
    del group_sizes
    return jnp.dot(lhs, rhs[0], preferred_element_type=jnp.float32).astype(lhs.dtype)


def native(lhs, rhs, group_sizes, scale=None):
    return grouped_matmul_cpu(lhs, rhs, group_sizes, scale)


def native_panels(lhs, panels, group_sizes, scale=None):
    return grouped_matmul_cpu_panels(lhs, panels, group_sizes, scale, outer=WIDTH)


def main() -> None:
    parser = argparse.ArgumentParser(description="Native CPU grouped matmul vs ragged_dot and gather + einsum.")
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16", "int8"])
    parser.add_argument("--ragged-max-tokens", type=int, default=64,
                        help="ragged_dot's dense dot over every expert is skipped above this many tokens")
    args = parser.parse_args()
    machine = machine_info()
    print(f"{machine.get('cpu')} ({machine.get('num_cpus')} cpus), JAX {jax.__version__}, load {load_average()}")
    copy_rate = copy_bytes_per_s(args.repeats, statistics.median)
    print(f"numpy copy {copy_rate / 1e9:.1f} GB/s (median)")
    results = {"cpu": machine.get("cpu"), "load_average": load_average(), "copy_gb_per_s": copy_rate / 1e9,
               "experts": args.experts, "rows": []}
    print("| weights | tokens | rows | touched experts | path | ms | GFLOP/s | GB/s on touched | / same-bytes read |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for dtype_name in args.dtypes:
        dtype = jnp.dtype(dtype_name)
        if not grouped_matmul_available(dtype):
            print(f"| {dtype_name} | – | – | – | native | no native kernel on this machine |")
            continue
        if dtype == jnp.int8:
            rhs = jnp.asarray(rng.integers(-127, 128, (args.experts, HIDDEN, WIDTH), dtype=np.int8))
            scale = jnp.asarray(rng.uniform(1e-3, 2e-3, (args.experts, WIDTH)).astype(np.float32))
            lhs_dtype = jnp.dtype(jnp.float32)
        else:
            rhs = jnp.asarray((rng.standard_normal((args.experts, HIDDEN, WIDTH)) / np.sqrt(HIDDEN)).astype(dtype))
            scale, lhs_dtype = None, dtype
        host_weights = np.asarray(rhs)
        panels = jnp.asarray(pack_expert_panels(host_weights))
        for tokens in args.tokens:
            rows = tokens * TOP_K
            lhs = jnp.asarray(rng.standard_normal((rows, HIDDEN)).astype(lhs_dtype))
            sizes = [jnp.asarray(s) for s in routings(rng, tokens, args.experts)]
            touched = statistics.median(int(np.count_nonzero(np.asarray(s))) for s in sizes)
            touched_bytes = touched * HIDDEN * WIDTH * dtype.itemsize
            paths = {"native": jax.jit(native), "native, panels": jax.jit(native_panels)}
            if dtype != jnp.int8 and tokens <= args.ragged_max_tokens:
                paths["ragged_dot"] = jax.jit(ragged)
            if dtype != jnp.int8 and rows * HIDDEN * WIDTH * dtype.itemsize <= GATHER_LIMIT_BYTES:
                paths["gather + einsum"] = jax.jit(gather_einsum)
            if dtype != jnp.int8:
                paths["dense dot"] = jax.jit(dense_dot)
            reads = ExpertReads(host_weights, int(touched))
            extra = () if scale is None else (scale,)
            calls = [(lhs, rhs, s, *extra) for s in sizes]
            reference = np.asarray(paths["native"](*calls[0]), np.float32)
            panel_calls = [(lhs, panels, *call[2:]) for call in calls]
            read_times, native_times, panel_times = [], [], []
            for _ in range(ROUNDS):  # alternating, so that all three see the same load
                read_times += call_seconds(reads.block_until_ready, args.repeats)
                native_times += seconds_each(paths["native"], calls, args.repeats)
                panel_times += seconds_each(paths["native, panels"], panel_calls, args.repeats)
            read_seconds = statistics.median(read_times)
            print(f"| {dtype_name} | {tokens} | {rows} | {touched:g} | read of the same bytes | "
                  f"{read_seconds * 1e3:.2f} | – | {touched_bytes / read_seconds / 1e9:.2f} | 1.00 |")
            for name, path in paths.items():
                if name == "native, panels":
                    np.testing.assert_allclose(np.asarray(path(*panel_calls[0]), np.float32), reference,
                                               rtol=1e-4, atol=1e-4)
                elif name not in ("native", "dense dot"):
                    np.testing.assert_allclose(np.asarray(path(*calls[0][:3]), np.float32), reference,
                                               rtol=2e-2, atol=2e-2)
                measured = {"native": native_times, "native, panels": panel_times}
                times = measured.get(name) or seconds_each(path, [c[:3] for c in calls], args.repeats)
                seconds = statistics.median(times)
                rate, flops = touched_bytes / seconds, 2 * rows * HIDDEN * WIDTH / seconds
                moe_path = name != "dense dot"  # the dense dot reads one expert, not the touched ones
                print(f"| {dtype_name} | {tokens} | {rows} | {touched:g} | {name} | {seconds * 1e3:.2f} | "
                      f"{flops / 1e9:.1f} | {f'{rate / 1e9:.2f}' if moe_path else '–'} | "
                      f"{f'{read_seconds / seconds:.2f}' if moe_path else '–'} |", flush=True)
                results["rows"].append({"dtype": dtype_name, "tokens": tokens, "rows": rows, "touched": touched,
                                        "path": name, "ms": seconds * 1e3, "gflop_per_s": flops / 1e9,
                                        "touched_gb_per_s": rate / 1e9, "same_bytes_read_ms": read_seconds * 1e3})
    results["load_average_after"] = load_average()
    print(f"load after: {load_average()}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
