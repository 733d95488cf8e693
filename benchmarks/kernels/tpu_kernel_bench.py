"""One-shot TPU check of the Mosaic kernels, ready for the day a TPU is at hand: correctness, decode MBU, prefill.

    PYTHONPATH=. python3 benchmarks/kernels/tpu_kernel_bench.py --out results/tpu.json [--smoke] [--sections decode ...]

Run on one TPU VM host (any generation; the chip's HBM bandwidth is looked up by its device kind). Every row that
checks numbers says PASS or FAIL against its dtype's tolerance (the float32 reference is the xla backend at HIGHEST
precision); the script exits 1 if any row fails. Timings are of one jitted fori_loop of --iters calls, each call's
output fed on as the next call's q, divided by --iters.

Sections (each one's result, or its error, is written to the JSON as soon as it ends; sections stop starting after
--budget-s, default 330 s):
  correctness  max |error| of ours (the per-step switch of tpu.py: the decode kernel or the tile kernel) in both KV
               layouts (interleaved; packed uint32) at SmolLM2 (9, 3, 64), Llama (32, 8, 128), (16, 2, 128) and a
               head_dim-256 shape, float32 / bfloat16, decode (uniform and ragged KV) / prefill / mixed; page sizes
               16, 32 and 64 at the first shape.
  decode       us per call, KV bytes per second and MBU (that over the chip's HBM bandwidth, and over a measured
               copy's) at (9, 3, 64) and (32, 8, 128), KV 512 / 2k / 8k and ragged 2k, bfloat16, ours in both
               layouts next to jax.experimental.pallas.ops.tpu.ragged_paged_attention on the same pages.
  prefill      a 1k-token causal prefill and a 512-token chunk + 32 decodes, ours vs jax's, us per call.
--smoke: tiny sizes in interpret mode on any machine, to check the script itself (jax's kernel is skipped: it has no
interpret mode).
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.kernels.kernel_bench_common import (
    TOLERANCE,
    Context,
    bench_arguments,
    check,
    copy_bandwidth,
    make_step,
    max_error,
    ragged_kv_lens,
    reference,
    run_sections,
    seconds_per_call,
)
from pallas_kernels.ragged_paged_attention.kv_layout_packed import pack_kv_pages
from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu

SHAPES = {"smollm_9x3_d64": (9, 3, 64), "llama8b_32x8_d128": (32, 8, 128)}
HBM_BYTES_PER_S = [("v6", 1640e9), ("v5 lite", 819e9), ("v5e", 819e9), ("v5", 2765e9), ("v4", 1228e9)]
"""Peak HBM bandwidth per chip, by a substring of jax's device_kind (first match wins): Google's published figures."""
LAYOUTS = ("interleaved", "packed")


def chip_bandwidth() -> float:
    """The default device's peak HBM bytes/s, or nan when its kind is not in the table (e.g. a CPU in --smoke)."""
    kind = jax.devices()[0].device_kind.lower()
    return next((rate for name, rate in HBM_BYTES_PER_S if name in kind), float("nan"))


def ours(ctx: Context, sm_scale: float, layout: str, num_kv_heads: int):
    """Our TPU kernel as a (q, interleaved pages, metadata) function; the packed pages are made outside the jit."""
    attend = functools.partial(ragged_paged_attention_tpu, sm_scale=sm_scale, interpret=ctx.interpret,
                               num_kv_heads=num_kv_heads if layout == "packed" else None)
    return jax.jit(attend)


def pages_in(layout: str, kv_pages):
    return pack_kv_pages(kv_pages) if layout == "packed" else kv_pages


def shipped(q, kv_pages, metadata, sm_scale: float):
    """jax's ragged paged attention (Mosaic only: no interpret mode) on the same interleaved pages."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    fn = jax.jit(functools.partial(ragged_paged_attention, sm_scale=sm_scale))
    return fn, (q, kv_pages, metadata.kv_lens, metadata.block_tables, metadata.cu_q_lens, metadata.num_seqs)


def time_candidates(ctx: Context, row: dict, section: str, q, kv_pages, metadata, expected, sm_scale: float,
                    num_kv_heads: int) -> dict[str, float]:
    """Seconds per call of ours in each layout (and of jax's kernel, off --smoke), each checked against `expected`
    first: row gets every candidate's error (and ours a PASS/FAIL); a candidate that raises is recorded and skipped
    (ours then counts as a failure)."""
    candidates: dict[str, tuple[Any, tuple]] = {
        layout: (ours(ctx, sm_scale, layout, num_kv_heads), (q, pages_in(layout, kv_pages), metadata))
        for layout in LAYOUTS}
    if not ctx.smoke:
        candidates["jax"] = shipped(q, kv_pages, metadata, sm_scale)
    seconds = {}
    for name, (fn, args) in candidates.items():
        try:
            row[f"{name}_error"] = max_error(fn(*args), expected)
            if name != "jax":  # theirs is timed beside ours, not judged
                check(ctx, row, f"{name}_error", jnp.bfloat16, section)
            seconds[name] = seconds_per_call(fn, args, ctx.iters)
        except Exception as error:  # e.g. a shape jax's kernel refuses: record, go on
            row[f"{name}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
            if name != "jax":
                ctx.failures.append(f"{section}: {row}")
    return seconds


def section_correctness(ctx: Context) -> dict:
    rows = []
    shapes = list(SHAPES.values()) + [(16, 2, 128), (8, 1, 256)]
    steps = {"decode": ([1] * 3, [700, 1, 2048]), "ragged decode": ([1] * 8, ragged_kv_lens(1500, 8)),
             "prefill": ([300], [300]), "mixed": ([200, 1, 1], [1500, 33, 900])}
    page_sizes = (16, 32, 64)
    if ctx.smoke:
        shapes = shapes[:1]
        steps = {"mixed": ([20, 1, 1], [60, 17, 33]), "ragged decode": ([1] * 3, ragged_kv_lens(70, 3))}
        page_sizes = (16, 32)
    for (num_q_heads, num_kv_heads, head_dim) in shapes:
        for dtype in (jnp.float32, jnp.bfloat16):
            for name, (q_lens, kv_lens) in steps.items():
                for page_size in page_sizes if (num_q_heads, num_kv_heads, head_dim) == shapes[0] else (16,):
                    q, kv_pages, metadata = make_step(q_lens, kv_lens, num_q_heads, num_kv_heads, head_dim, dtype,
                                                      page_size)
                    sm_scale = head_dim ** -0.5
                    expected = reference(q, kv_pages, metadata, sm_scale)
                    for layout in LAYOUTS:
                        fn = ours(ctx, sm_scale, layout, num_kv_heads)
                        row = dict(shape=[num_q_heads, num_kv_heads, head_dim], dtype=jnp.dtype(dtype).name,
                                   step=name, page_size=page_size, layout=layout,
                                   max_abs_error=max_error(fn(q, pages_in(layout, kv_pages), metadata), expected))
                        check(ctx, row, "max_abs_error", dtype, "correctness")
                        rows.append(row)
                        print(f"  correctness {row}", flush=True)
    return dict(rows=rows, tolerance=TOLERANCE)


def section_decode(ctx: Context) -> dict:
    copy = copy_bandwidth(ctx)
    peak = chip_bandwidth()
    rows = []
    cases = [(kv_len, False) for kv_len in ctx.kv_lens] + [(ctx.kv_lens[1], True)]
    for shape_name, (num_q_heads, num_kv_heads, head_dim) in SHAPES.items():
        for kv_len, ragged in cases:
            if ctx.out_of_time():
                rows.append(dict(shape=shape_name, kv_len=kv_len, ragged=ragged, skipped="time budget"))
                continue
            num_seqs = ctx.seqs_for(kv_len)
            kv_lens = ragged_kv_lens(kv_len, num_seqs) if ragged else [kv_len] * num_seqs
            q, kv_pages, metadata = make_step([1] * num_seqs, kv_lens, num_q_heads, num_kv_heads, head_dim,
                                              jnp.bfloat16, ctx.page_size)
            sm_scale = head_dim ** -0.5
            kv_bytes = sum(kv_lens) * 2 * num_kv_heads * head_dim * 2
            expected = reference(q, kv_pages, metadata, sm_scale)
            row: dict[str, Any] = dict(shape=shape_name, kv_len=kv_len, ragged=ragged, num_seqs=num_seqs,
                                       kv_bytes=kv_bytes)
            for name, seconds in time_candidates(ctx, row, "decode", q, kv_pages, metadata, expected, sm_scale,
                                                 num_kv_heads).items():
                row[f"{name}_us"] = 1e6 * seconds
                row[f"{name}_mbu"] = kv_bytes / seconds / peak
                row[f"{name}_fraction_of_copy"] = kv_bytes / seconds / copy
            rows.append(row)
            print(f"  decode {row}", flush=True)
    return dict(copy_bytes_per_s=copy, chip_hbm_bytes_per_s=peak, rows=rows)


def section_prefill(ctx: Context) -> dict:
    rows = []
    steps = {"prefill 1k": ([1024], [1024]), "512 chunk + 32 decodes": ([512] + [1] * 32, [1536] + [2048] * 32)}
    if ctx.smoke:
        steps = {"prefill 48": ([48], [48])}
    for shape_name, (num_q_heads, num_kv_heads, head_dim) in SHAPES.items():
        for step_name, (q_lens, kv_lens) in steps.items():
            if ctx.out_of_time():
                rows.append(dict(shape=shape_name, step=step_name, skipped="time budget"))
                continue
            q, kv_pages, metadata = make_step(q_lens, kv_lens, num_q_heads, num_kv_heads, head_dim, jnp.bfloat16,
                                              ctx.page_size)
            sm_scale = head_dim ** -0.5
            expected = reference(q, kv_pages, metadata, sm_scale)
            row: dict[str, Any] = dict(shape=shape_name, step=step_name)
            for name, seconds in time_candidates(ctx, row, "prefill", q, kv_pages, metadata, expected, sm_scale,
                                                 num_kv_heads).items():
                row[f"{name}_us"] = 1e6 * seconds
            rows.append(row)
            print(f"  prefill {row}", flush=True)
    return dict(rows=rows)


SECTIONS = [("correctness", section_correctness), ("decode", section_decode), ("prefill", section_prefill)]


def main() -> None:
    flags = bench_arguments(__doc__ or "", SECTIONS).parse_args()
    run_sections(Context(flags, "tpu"), flags, SECTIONS)


if __name__ == "__main__":
    main()
