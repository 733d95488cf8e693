"""One-shot GPU check of the Triton grouped matmul (MoE experts): correctness, decode against the bandwidth floor of
the touched experts (issue 58's goal: within 1.3x at a decode batch of 64), prefill, and a tile sweep.

    PYTHONPATH=. python3 benchmarks/kernels/gpu_grouped_matmul_bench.py --out results/gmm.json [--smoke]

Shapes: Qwen3-30B-A3B (128 experts, top 8, hidden 2048, expert width 768: gate / up [E, 2048, 768], down
[E, 768, 2048]) and gpt-oss-120b (128 experts, top 4, 2880 both ways), each token's experts drawn at random without
repeats (a fresh routing per shape, fixed seed). bfloat16 activations; bfloat16 or int8 (+ float32 column scales)
experts.

Sections (each one's result, or its error, is written to the JSON as soon as it ends; sections stop starting after
--budget-s, default 330 s):
  correctness  max |error| vs grouped_matmul_reference (ragged_dot in float32, HIGHEST) at the decode shapes and a
               prefill on 16 experts (the reference's dense expansion of 128 would need 4 GiB), bfloat16 and int8.
  decode       64 tokens: us per call, the touched experts' bytes (+ lhs and out) over a measured device copy's
               bandwidth = the floor, and ours / floor (goal <= 1.3); next to jax.lax.ragged_dot as XLA compiles it
               (dense expansion), ragged_dot with XLA's cuDNN ragged-dot fusion asked for (bfloat16 out; the
               row says whether the optimized HLO kept the ragged-dot), and jax's Mosaic GPU ragged_dot (Hopper)
               where it runs.
  prefill      512 tokens: us and TFLOP/s on the real rows, ours vs ragged_dot and one dense dot of as many rows
               (the same multiply-adds through one weight: the compute rate to compare with).
  sweep        decode tiles: k step x column tile (16-row tiles), then warps x stages at the best of those.
Timings: a jitted fori_loop of --iters calls, each call's lhs taking one element of the previous output (so no call
can be hoisted or dropped), divided by --iters. --smoke: tiny sizes in interpret mode on any machine.
"""

import functools
import itertools
import time
from collections.abc import Callable
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.kernels.kernel_bench_common import (
    TOLERANCE,
    Context,
    bench_arguments,
    check,
    copy_bandwidth,
    max_error,
    run_sections,
)
from pallas_kernels.grouped_matmul import grouped_matmul_gpu, grouped_matmul_reference
from pallas_kernels.grouped_matmul.gpu_schedule import choose_gpu_tiles
from pallas_kernels.grouped_matmul.tpu_tiles import GroupedMatmulTiles

# name: (experts, top_k, k, n)
SHAPES = {
    "qwen3_30b_a3b_gate_or_up": (128, 8, 2048, 768),
    "qwen3_30b_a3b_down": (128, 8, 768, 2048),
    "gpt_oss_120b_gate_or_up": (128, 4, 2880, 2880),
    "gpt_oss_120b_down": (128, 4, 2880, 2880),
}
SMOKE_SHAPES = {"tiny_gate_or_up": (8, 2, 96, 72), "tiny_down": (8, 2, 72, 96)}
DECODE_TOKENS, PREFILL_TOKENS = 64, 512
GOAL = 1.3


def shapes(ctx: Context) -> dict[str, tuple[int, int, int, int]]:
    return SMOKE_SHAPES if ctx.smoke else SHAPES


def group_sizes(tokens: int, experts: int, top_k: int, seed: int = 0) -> np.ndarray:
    """Each token's top_k experts drawn at random without repeats, counted per expert."""
    rng = np.random.default_rng(seed)
    chosen = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)])
    return np.bincount(chosen.ravel(), minlength=experts).astype(np.int32)


def operands(rows: int, experts: int, k: int, n: int, weights: str, seed: int = 0) -> tuple:
    """(lhs bf16 [rows, k], rhs [experts, k, n] bf16 or int8, scale [experts, n] or None), O(1) outputs."""
    key_lhs, key_rhs, key_scale = jax.random.split(jax.random.key(seed), 3)
    lhs = jax.random.normal(key_lhs, (rows, k), jnp.bfloat16)
    if weights == "int8":
        rhs = jax.random.randint(key_rhs, (experts, k, n), -127, 128, jnp.int32).astype(jnp.int8)
        scale = jax.random.uniform(key_scale, (experts, n), jnp.float32, 0.5, 1.5) / (127 * np.sqrt(k))
        return lhs, rhs, scale
    return lhs, (jax.random.normal(key_rhs, (experts, k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16), None


def seconds_per_call(fn: Callable, lhs, rest: tuple, iters: int, compiler_options: Optional[dict] = None,
                     repeats: int = 3) -> float:
    """Median over repeats of one jitted loop of `iters` calls / iters; each call's lhs[0, 0] is the previous
    output's [0, 0] (a one-element update), so the calls stay sequential and none is dropped."""
    def looped(lhs, *rest):
        def body(_, x):
            out = fn(x, *rest)
            return x.at[0, 0].set(out[0, 0].astype(x.dtype))
        return jax.lax.fori_loop(0, iters, body, lhs)

    compiled = jax.jit(looped).lower(lhs, *rest).compile(compiler_options)
    jax.block_until_ready(compiled(lhs, *rest))
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(lhs, *rest))
        timings.append((time.perf_counter() - start) / iters)
    return sorted(timings)[len(timings) // 2]


def ours(ctx: Context, tiles: Optional[GroupedMatmulTiles] = None, **options) -> Callable:
    return functools.partial(grouped_matmul_gpu, tiles=tiles, interpret=ctx.interpret, **options)


def ragged_dot(lhs, rhs, sizes, scale=None, out_dtype=jnp.float32):
    """jax.lax.ragged_dot as expert_matmul's fallback calls it (int8 converted first, scales after)."""
    weight = rhs if scale is None else rhs.astype(lhs.dtype)
    out = jax.lax.ragged_dot(lhs, weight, sizes, preferred_element_type=out_dtype)
    if scale is not None:
        rows_group = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(lhs.shape[0]), side="right")
        out = out * scale[jnp.minimum(rows_group, sizes.shape[0] - 1)]
    return out.astype(lhs.dtype)


def mosaic_ragged_dot(lhs, rhs, sizes, scale=None):
    """jax.experimental.pallas.ops.gpu.ragged_dot_mgpu (Hopper wgmma; bfloat16 weights only)."""
    from jax.experimental.pallas.ops.gpu.ragged_dot_mgpu import ragged_dot as mgpu

    return mgpu(lhs, rhs, group_sizes=sizes, block_m=64, block_n=128, block_k=64, max_concurrent_steps=4,
                grid_block_n=1)


def keeps_ragged_dot(fn: Callable, args: tuple, compiler_options: dict) -> Any:
    """Whether XLA's optimized HLO still holds a ragged-dot (not rewritten to a dense dot), or the error."""
    try:
        return "ragged-dot" in (jax.jit(fn).lower(*args).compile(compiler_options).as_text() or "")
    except Exception as error:
        return f"{type(error).__name__}: {str(error)[:300]}"


def touched_bytes(sizes: np.ndarray, rows: int, k: int, n: int, weights: str) -> int:
    """The least a call must move: each non-empty expert's weights (and scales) once, lhs read, out written."""
    per_expert = k * n * (1 if weights == "int8" else 2) + (4 * n if weights == "int8" else 0)
    return int(np.count_nonzero(sizes)) * per_expert + rows * (k + n) * 2


def timed(ctx: Context, row: dict, key: str, fn: Callable, args: tuple, **options) -> None:
    """row[key] = us per call, or the error that stopped it (a baseline that fails must not lose the row)."""
    try:
        row[key] = round(1e6 * seconds_per_call(fn, args[0], args[1:], ctx.iters, **options), 1)
    except Exception as error:
        row[key] = f"{type(error).__name__}: {str(error)[:300]}"


def section_correctness(ctx: Context) -> dict:
    rows = []
    for (name, (experts, top_k, k, n)), weights in itertools.product(shapes(ctx).items(), ("bfloat16", "int8")):
        cases = [("decode", DECODE_TOKENS, experts), ("prefill, 16 experts", PREFILL_TOKENS, min(16, experts))]
        for step, tokens, num_experts in cases[:1] if ctx.smoke else cases:
            sizes = jnp.asarray(group_sizes(tokens, num_experts, min(top_k, num_experts)))
            lhs, rhs, scale = operands(tokens * top_k, num_experts, k, n, weights)
            out = jax.jit(ours(ctx))(lhs, rhs, sizes, scale)
            row = dict(shape=name, step=step, weights=weights, rows=tokens * top_k,
                       max_abs_error=max_error(out, grouped_matmul_reference(lhs, rhs, sizes, scale)))
            check(ctx, row, "max_abs_error", jnp.bfloat16, "correctness")
            rows.append(row)
            print(f"  correctness {row}", flush=True)
    return dict(rows=rows, tolerance=TOLERANCE["bfloat16"])


def section_decode(ctx: Context) -> dict:
    bandwidth = copy_bandwidth(ctx)
    rows = []
    for (name, (experts, top_k, k, n)), weights in itertools.product(shapes(ctx).items(), ("bfloat16", "int8")):
        sizes_host = group_sizes(DECODE_TOKENS, experts, top_k, seed=1)
        lhs, rhs, scale = operands(DECODE_TOKENS * top_k, experts, k, n, weights)
        args = (lhs, rhs, jnp.asarray(sizes_host), scale)
        floor_us = 1e6 * touched_bytes(sizes_host, lhs.shape[0], k, n, weights) / bandwidth
        row: dict[str, Any] = dict(shape=name, weights=weights, rows=lhs.shape[0],
                                   touched_experts=int(np.count_nonzero(sizes_host)), floor_us=round(floor_us, 1),
                                   tiles=str(choose_gpu_tiles(lhs.shape[0], experts, lhs.dtype)))
        timed(ctx, row, "ours_us", ours(ctx), args)
        if isinstance(row["ours_us"], float):
            row["ours_over_floor"] = round(row["ours_us"] / floor_us, 2)
            row["goal"] = "MET" if row["ours_over_floor"] <= GOAL else f"MISSED (> {GOAL})"
        if not ctx.smoke:
            timed(ctx, row, "ragged_dot_us", ragged_dot, args)
            row["xla_kept_the_ragged_dot"] = keeps_ragged_dot(ragged_dot, args, {})  # docs/features.md: False
            bf16_out = functools.partial(ragged_dot, out_dtype=jnp.bfloat16)
            cudnn = {"xla_gpu_experimental_use_ragged_dot_fusion": True}
            timed(ctx, row, "ragged_dot_cudnn_fusion_us", bf16_out, args, compiler_options=cudnn)
            row["cudnn_fusion_kept_the_ragged_dot"] = keeps_ragged_dot(bf16_out, args, cudnn)
            if weights == "bfloat16":
                timed(ctx, row, "mosaic_gpu_ragged_dot_us", mosaic_ragged_dot, args[:3])
        rows.append(row)
        print(f"  decode {row}", flush=True)
    return dict(copy_bandwidth_gb_s=round(bandwidth / 1e9, 1), goal=GOAL, rows=rows)


def section_prefill(ctx: Context) -> dict:
    rows = []
    for name, (experts, top_k, k, n) in shapes(ctx).items():
        sizes = jnp.asarray(group_sizes(PREFILL_TOKENS, experts, top_k, seed=2))
        lhs, rhs, _ = operands(PREFILL_TOKENS * top_k, experts, k, n, "bfloat16")
        row: dict[str, Any] = dict(shape=name, rows=lhs.shape[0],
                                   tiles=str(choose_gpu_tiles(lhs.shape[0], experts, lhs.dtype)))
        timed(ctx, row, "ours_us", ours(ctx), (lhs, rhs, sizes))
        if not ctx.smoke:
            timed(ctx, row, "ragged_dot_us", ragged_dot, (lhs, rhs, sizes))
            timed(ctx, row, "dense_dot_us", lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32),
                  (lhs, rhs[0]))
        flops = 2 * lhs.shape[0] * k * n
        for key in ("ours_us", "ragged_dot_us", "dense_dot_us"):
            if isinstance(row.get(key), float):
                row[key.replace("_us", "_tflop_s")] = round(flops / row[key] / 1e6, 1)
        rows.append(row)
        print(f"  prefill {row}", flush=True)
    return dict(rows=rows)


def section_sweep(ctx: Context) -> dict:
    rows = []
    for name in list(shapes(ctx))[::2]:  # one projection per model: gate / up
        experts, top_k, k, n = shapes(ctx)[name]
        sizes_host = group_sizes(DECODE_TOKENS, experts, top_k, seed=1)
        lhs, rhs, _ = operands(DECODE_TOKENS * top_k, experts, k, n, "bfloat16")
        args = (lhs, rhs, jnp.asarray(sizes_host))
        results = []
        for tk, tn in itertools.product((64, 128, 256), (64, 128, 256)):
            row: dict[str, Any] = dict(shape=name, tiles=[16, tk, tn], num_warps=4, num_stages=3)
            timed(ctx, row, "us", ours(ctx, GroupedMatmulTiles(16, tk, tn)), args)
            results.append(row)
        best = min((r for r in results if isinstance(r["us"], float)), key=lambda r: r["us"], default=results[0])
        for warps, stages in itertools.product((4, 8), (2, 3, 4)):
            row = dict(shape=name, tiles=best["tiles"], num_warps=warps, num_stages=stages)
            timed(ctx, row, "us", ours(ctx, GroupedMatmulTiles(*best["tiles"]), num_warps=warps, num_stages=stages),
                  args)
            results.append(row)
        for row in results:
            print(f"  sweep {row}", flush=True)
        rows += results
        if ctx.out_of_time():
            break
    return dict(rows=rows)


SECTIONS = [("correctness", section_correctness), ("decode", section_decode), ("prefill", section_prefill),
            ("sweep", section_sweep)]


def main() -> None:
    flags = bench_arguments(__doc__ or "", SECTIONS).parse_args()
    run_sections(Context(flags, "gpu"), flags, SECTIONS)


if __name__ == "__main__":
    main()
