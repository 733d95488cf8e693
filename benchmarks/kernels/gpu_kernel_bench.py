"""One-shot GPU check of the Triton-lowered kernel: correctness, decode bandwidth, layers, prefill, a sweep.

    PYTHONPATH=. python3 benchmarks/kernels/gpu_kernel_bench.py --out results/gpu.json [--smoke] [--sections decode ...]

Every row that checks numbers says PASS or FAIL against the tolerance of its dtype (the float32 reference is
computed at HIGHEST matmul precision, not TF32); the script exits 1 if any row fails. Timings are of one jitted
fori_loop of --iters calls, each call's output fed on as the next call's q (so none can be hoisted or skipped),
divided by --iters: the device's time per call, without a host round trip per call.

Sections (each one's result, or its error, is written to the JSON as soon as it ends; a section is
skipped once the time budget, default 330 s, is spent, so the script stays under 6 minutes):
  correctness  max |error| vs the xla backend (float32 math) at real shapes, float32 and bfloat16,
               decode (uniform and ragged KV lengths) / prefill / mixed, head_dim 64, 128 and 80 (padded
               path), page sizes 16, 32 and 64.
  decode       us and KV GB/s at (9 q, 3 kv, d64) and (32, 8, d128), KV 512 / 2k / 8k (and ragged 2k:
               lengths spread over 1/8..1 of it), bfloat16, next to jax.experimental.pallas.ops.gpu.
               paged_attention on the same pages, and a big copy.
  layers_scan  a decode step through a jitted lax.scan over 8 layers of one stacked cache (page ids
               shifted per layer, as the model does), per layer, vs one call.
  prefill      a 1k-token causal prefill and a 512-token chunk + 32 decodes: ours (default tiles and
               128 rows x 8 warps) vs jax.nn.dot_product_attention(implementation="cudnn") on dense K/V.
  sweep        num_kv_splits x num_stages on the (32, 8, d128) decodes.
--smoke: tiny sizes in interpret mode on any machine, to check the script itself (no cudnn).
"""

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
from pallas_kernels.ragged_paged_attention.gpu import ragged_paged_attention_gpu

SHAPES = {"smollm_9x3_d64": (9, 3, 64), "llama8b_32x8_d128": (32, 8, 128)}


def ours(ctx: Context, sm_scale: float, **options):
    return jax.jit(functools.partial(ragged_paged_attention_gpu, sm_scale=sm_scale, interpret=ctx.interpret,
                                     **options))










def section_correctness(ctx: Context) -> dict:
    rows = []
    shapes = list(SHAPES.values()) + [(16, 2, 128), (8, 2, 80)]
    steps = {"decode": ([1] * 3, [700, 1, 2048]), "ragged decode": ([1] * 8, ragged_kv_lens(1500, 8)),
             "prefill": ([300], [300]), "mixed": ([200, 1, 1], [1500, 33, 900])}
    page_sizes = (16, 32, 64)
    if ctx.smoke:
        steps = {"mixed": ([20, 1, 1], [60, 17, 33]), "ragged decode": ([1] * 3, ragged_kv_lens(70, 3))}
        page_sizes = (16, 32)
    for (num_q_heads, num_kv_heads, head_dim) in shapes[:2] if ctx.smoke else shapes:
        for dtype in (jnp.float32, jnp.bfloat16):
            for name, (q_lens, kv_lens) in steps.items():
                # Every page size at the first shape; the others at the engine's default.
                for page_size in page_sizes if (num_q_heads, num_kv_heads, head_dim) == shapes[0] else (16,):
                    q, kv_pages, metadata = make_step(q_lens, kv_lens, num_q_heads, num_kv_heads, head_dim, dtype,
                                                      page_size)
                    sm_scale = head_dim ** -0.5
                    error = max_error(ours(ctx, sm_scale)(q, kv_pages, metadata),
                                      reference(q, kv_pages, metadata, sm_scale))
                    row = dict(shape=[num_q_heads, num_kv_heads, head_dim], dtype=jnp.dtype(dtype).name, step=name,
                               page_size=page_size, max_abs_error=error)
                    check(ctx, row, "max_abs_error", dtype, "correctness")
                    rows.append(row)
                    print(f"  correctness {row}", flush=True)
    return dict(rows=rows, tolerance=TOLERANCE)




def shipped_decode(q, kv_pages, metadata, sm_scale, interpret):
    """jax's ops.gpu.paged_attention on the same pages (split K / V layout built outside the timing)."""
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

    k_pages = jnp.moveaxis(kv_pages[:, :, 0::2], 2, 0)  # [kv_heads, pages, page_size, d]
    v_pages = jnp.moveaxis(kv_pages[:, :, 1::2], 2, 0)
    scaled_q = (q.astype(jnp.float32) * sm_scale).astype(q.dtype)  # it has no sm_scale argument
    # Its asserts: the table width divisible by k_splits, a partition by pages_per_compute_block.
    pages_per_seq = metadata.block_tables.shape[1]
    k_splits = math.gcd(16, pages_per_seq)
    fn = jax.jit(functools.partial(paged_attention, k_splits=k_splits,
                                   pages_per_compute_block=math.gcd(8, pages_per_seq // k_splits), interpret=interpret))
    return fn, (scaled_q, k_pages, v_pages, metadata.block_tables, metadata.kv_lens)


def section_decode(ctx: Context) -> dict:
    hbm = copy_bandwidth(ctx)
    rows = []
    cases = [(kv_len, False) for kv_len in ctx.kv_lens] + [(ctx.kv_lens[1], True)]
    for shape_name, (num_q_heads, num_kv_heads, head_dim) in SHAPES.items():
        for kv_len, ragged in cases:
            if ctx.out_of_time():
                rows.append(dict(shape=shape_name, kv_len=kv_len, ragged=ragged, skipped="time budget"))
                continue
            num_seqs = ctx.seqs_for(kv_len)
            kv_lens = ragged_kv_lens(kv_len, num_seqs) if ragged else [kv_len] * num_seqs
            q, kv_pages, metadata = make_step([1] * num_seqs, kv_lens, num_q_heads, num_kv_heads,
                                              head_dim, jnp.bfloat16, ctx.page_size)
            sm_scale = head_dim ** -0.5
            kv_bytes = sum(kv_lens) * 2 * num_kv_heads * head_dim * 2
            expected = reference(q, kv_pages, metadata, sm_scale)
            fn = ours(ctx, sm_scale)
            row = dict(shape=shape_name, kv_len=kv_len, ragged=ragged, num_seqs=num_seqs, kv_bytes=kv_bytes,
                       ours_error=max_error(fn(q, kv_pages, metadata), expected))
            check(ctx, row, "ours_error", jnp.bfloat16, "decode")
            row["ours_us"] = 1e6 * seconds_per_call(fn, (q, kv_pages, metadata), ctx.iters)
            row["ours_fraction_of_copy"] = kv_bytes / (row["ours_us"] * 1e-6) / hbm
            try:
                shipped, args = shipped_decode(q, kv_pages, metadata, sm_scale, ctx.interpret)
                row["jax_error"] = max_error(shipped(*args), expected)
                row["jax_check"] = "PASS" if row["jax_error"] <= TOLERANCE["bfloat16"] else "FAIL"  # theirs: noted only
                row["jax_us"] = 1e6 * seconds_per_call(shipped, args, ctx.iters)
            except Exception as error:  # e.g. a GQA group its block_h cannot take: record, go on
                row["jax_error"] = f"{type(error).__name__}: {str(error)[:300]}"
            rows.append(row)
            print(f"  decode {row}", flush=True)
    return dict(copy_bytes_per_s=hbm, rows=rows)


def section_layers_scan(ctx: Context) -> dict:
    num_layers, kv_len = 8, ctx.kv_lens[1]
    num_q_heads, num_kv_heads, head_dim = SHAPES["llama8b_32x8_d128"] if not ctx.smoke else (4, 2, 64)
    num_seqs = ctx.seqs_for(kv_len)
    q, kv_pages, metadata = make_step([1] * num_seqs, [kv_len] * num_seqs, num_q_heads, num_kv_heads, head_dim,
                                      jnp.bfloat16, ctx.page_size)
    pages_per_layer = kv_pages.shape[0]
    stacked = jnp.concatenate([kv_pages] * num_layers)  # the runner's all-layers cache
    attend = functools.partial(ragged_paged_attention_gpu, sm_scale=head_dim ** -0.5, interpret=ctx.interpret)

    @jax.jit
    def step(q, stacked, metadata):
        def layer(x, index):
            # Feeding each layer's output on as the next q keeps the layers sequential, like the model.
            out = attend(x, stacked, metadata.on_pages_from(index * pages_per_layer, ctx.page_size))
            return out.astype(x.dtype), None
        return jax.lax.scan(layer, q, jnp.arange(num_layers, dtype=jnp.int32))[0]

    scan_us = 1e6 * seconds_per_call(step, (q, stacked, metadata), ctx.iters)
    single_us = 1e6 * seconds_per_call(jax.jit(attend), (q, kv_pages, metadata), ctx.iters)
    return dict(num_layers=num_layers, kv_len=kv_len, num_seqs=num_seqs, scan_us_per_layer=scan_us / num_layers,
                single_call_us=single_us)


def cudnn_prefill(q, kv_pages, metadata, page_size):
    """jax.nn.dot_product_attention(cudnn) on the one sequence's K/V gathered dense (outside the timing)."""
    kv_len = int(metadata.kv_lens[0])
    slots = (np.asarray(metadata.block_tables[0])[:, None] * page_size + np.arange(page_size)).reshape(-1)[:kv_len]
    rows = kv_pages.reshape(-1, *kv_pages.shape[2:])[jnp.asarray(slots)]
    keys, values = rows[None, :, 0::2], rows[None, :, 1::2]
    fn = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation="cudnn",
                                   scale=q.shape[-1] ** -0.5))
    return fn, (q[None], keys, values)


def section_prefill(ctx: Context) -> dict:
    rows = []
    steps = {"prefill 1k": ([1024], [1024]), "512 chunk + 32 decodes": ([512] + [1] * 32, [1536] + [2048] * 32)}
    if ctx.smoke:
        steps = {"prefill 48": ([48], [48])}
    tiles = {"default": {}, "128 rows x 8 warps": dict(block_rows=128, num_warps=8)}
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
            for tile_name, options in tiles.items():
                fn = ours(ctx, sm_scale, **options)
                row[f"ours_{tile_name}_error"] = max_error(fn(q, kv_pages, metadata), expected)
                check(ctx, row, f"ours_{tile_name}_error", jnp.bfloat16, "prefill")
                row[f"ours_{tile_name}_us"] = 1e6 * seconds_per_call(fn, (q, kv_pages, metadata), ctx.iters)
            if len(q_lens) == 1 and not ctx.smoke:
                try:
                    fn, args = cudnn_prefill(q, kv_pages, metadata, ctx.page_size)
                    row["cudnn_error"] = max_error(fn(*args)[0], expected)
                    row["cudnn_us"] = 1e6 * seconds_per_call(fn, args, ctx.iters)
                except Exception as error:
                    row["cudnn_error"] = f"{type(error).__name__}: {str(error)[:300]}"
            rows.append(row)
            print(f"  prefill {row}", flush=True)
    return dict(rows=rows)


def section_sweep(ctx: Context) -> dict:
    num_q_heads, num_kv_heads, head_dim = SHAPES["llama8b_32x8_d128"] if not ctx.smoke else (4, 2, 64)
    rows = []
    for kv_len in ctx.kv_lens[1:]:
        num_seqs = ctx.seqs_for(kv_len)
        q, kv_pages, metadata = make_step([1] * num_seqs, [kv_len] * num_seqs, num_q_heads, num_kv_heads, head_dim,
                                          jnp.bfloat16, ctx.page_size)
        for splits in ((None, 2) if ctx.smoke else (None, 1, 2, 4, 8, 16)):
            for stages in ((2,) if ctx.smoke else (2, 3, 4)):
                if ctx.out_of_time():
                    return dict(rows=rows, stopped="time budget")
                fn = ours(ctx, head_dim ** -0.5, num_kv_splits=splits, num_stages=stages)
                us = 1e6 * seconds_per_call(fn, (q, kv_pages, metadata), ctx.iters)
                rows.append(dict(kv_len=kv_len, num_kv_splits=splits, num_stages=stages, us=us))
                print(f"  sweep {rows[-1]}", flush=True)
    return dict(rows=rows)


SECTIONS = [("correctness", section_correctness), ("decode", section_decode), ("layers_scan", section_layers_scan),
            ("prefill", section_prefill), ("sweep", section_sweep)]


def main() -> None:
    flags = bench_arguments(__doc__ or "", SECTIONS).parse_args()
    run_sections(Context(flags, "gpu"), flags, SECTIONS)


if __name__ == "__main__":
    main()
