"""What the one-shot kernel benches (gpu_kernel_bench.py, tpu_kernel_bench.py) share: the context of flags and
clock, random steps on the device, the float32 reference, PASS/FAIL checks, loop timing and the section runner.

Each bench is one prepared script for a short lease of an accelerator: every section's numbers (or its error) are
written to the JSON as soon as it ends, sections stop starting after --budget-s, and the exit status is 1 when any
checked row is over its tolerance, so a run is judged by its exit code and read from its JSON.
"""

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.kernels.xla_attention import ragged_paged_attention_xla
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata

TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}
"""Max |error| against the float32 reference a row may show and PASS (bfloat16: its inputs' own rounding)."""


class Context:
    """Flags, the clock and the sizes every section uses. Off its platform a bench runs tiny sizes in interpret
    mode (--smoke), to check the script itself."""

    def __init__(self, flags: argparse.Namespace, platform: str):
        self.smoke = flags.smoke or jax.default_backend() != platform
        self.interpret = self.smoke
        self.deadline = time.monotonic() + flags.budget_s
        self.iters = 1 if self.smoke else flags.iters
        self.page_size = 16
        self.kv_lens = (40, 100) if self.smoke else (512, 2048, 8192)
        self.failures: list[str] = []
        """Rows that failed their tolerance, named."""

    def seqs_for(self, kv_len: int) -> int:
        """Decode batch size: big enough to fill the device, small enough that 8k stays in memory."""
        return 3 if self.smoke else (64 if kv_len <= 2048 else 32)

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline


def make_step(q_lens, kv_lens, num_q_heads, num_kv_heads, head_dim, dtype, page_size, *, seed=0):
    """(q, kv_pages, metadata) on the device: host metadata, device-random q and interleaved pages."""
    meta = make_ragged_batch(q_lens, kv_lens, num_q_heads=1, num_kv_heads=1, head_dim=1, page_size=page_size,
                             seed=seed)
    q_key, kv_key = jax.random.split(jax.random.key(seed))
    q = jax.random.normal(q_key, (sum(q_lens), num_q_heads, head_dim), dtype)
    kv_pages = jax.random.normal(kv_key, (meta.kv_pages.shape[0], page_size, 2 * num_kv_heads, head_dim), dtype)
    metadata = AttentionMetadata(*[jnp.asarray(getattr(meta, f)) for f in (
        "slot_mapping", "kv_lens", "block_tables", "cu_q_lens", "num_seqs")])
    return q, kv_pages, metadata


def ragged_kv_lens(kv_len: int, num_seqs: int, seed: int = 0) -> list[int]:
    """num_seqs KV lengths spread over [kv_len / 8, kv_len] (the longest is kv_len): a batch of unequal requests."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, kv_len // 8), kv_len + 1, num_seqs)
    lengths[0] = kv_len
    return [int(n) for n in lengths]


def seconds_per_call(fn: Callable, args: tuple, iters: int, repeats: int = 3) -> float:
    """Median over repeats of (time of one jitted loop of `iters` calls) / iters, after a compiling call.

    The loop feeds each call's output on as the next call's first argument (the q of attention, the input of a
    copy), so XLA can neither hoist the call out of the loop nor drop an iteration."""
    first, rest = args[0], args[1:]

    @jax.jit
    def looped(first, *rest):
        return jax.lax.fori_loop(0, iters, lambda _, x: fn(x, *rest).astype(x.dtype).reshape(x.shape), first)

    jax.block_until_ready(looped(first, *rest))
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(looped(first, *rest))
        timings.append((time.perf_counter() - start) / iters)
    return statistics.median(timings)


def copy_bandwidth(ctx: Context) -> float:
    """Bytes/s of a large device copy (read + write): the ceiling decode attention is judged by."""
    x = jnp.ones(((2 ** 18) if ctx.smoke else (2 ** 29),), jnp.float32)
    return 2 * x.nbytes / seconds_per_call(lambda x: x + 1.0, (x,), ctx.iters)


def max_error(out, expected) -> float:
    return float(jnp.max(jnp.abs(out.astype(jnp.float32) - expected.astype(jnp.float32))))


def check(ctx: Context, row: dict, error_key: str, dtype, name: str) -> None:
    """Mark row[error_key] PASS or FAIL against the dtype's tolerance (FAILs are remembered for the exit code)."""
    tolerance = TOLERANCE[jnp.dtype(dtype).name]
    passed = isinstance(row[error_key], float) and row[error_key] <= tolerance
    row[error_key.removesuffix("error") + "check"] = "PASS" if passed else f"FAIL (> {tolerance:g})"
    if not passed:
        ctx.failures.append(f"{name}: {row}")


def reference(q, kv_pages, metadata, sm_scale):
    """The xla backend in float32 at HIGHEST matmul precision (not TF32): what every kernel is checked against."""
    with jax.default_matmul_precision("highest"):
        return jax.jit(functools.partial(ragged_paged_attention_xla, sm_scale=sm_scale))(
            q.astype(jnp.float32), kv_pages.astype(jnp.float32), metadata)


def bench_arguments(description: str, sections: list[tuple[str, Callable]]) -> argparse.ArgumentParser:
    """The flags every bench takes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON report, rewritten after each section")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes in interpret mode (any machine)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop starting sections after this")
    parser.add_argument("--iters", type=int, default=20, help="calls per timed loop")
    parser.add_argument("--sections", nargs="+", choices=[name for name, _ in sections],
                        default=[name for name, _ in sections], help="run only these sections (default: all)")
    return parser


def run_sections(ctx: Context, flags: argparse.Namespace, sections: list[tuple[str, Callable]]) -> None:
    """Run the chosen sections in order, writing the JSON after each; exit 1 on a failed check or a section's error."""
    report: dict[str, Any] = dict(jax_version=jax.__version__, backend=jax.default_backend(),
                                  device=str(jax.devices()[0].device_kind), smoke=ctx.smoke, sections={})
    print(f"jax {jax.__version__} on {report['device']}{' (SMOKE: interpret mode)' if ctx.smoke else ''}",
          flush=True)
    for name, section in sections:
        if name not in flags.sections:
            continue
        start = time.monotonic()
        if ctx.out_of_time():
            report["sections"][name] = dict(skipped="time budget")
        else:
            try:
                report["sections"][name] = section(ctx)
            except Exception as error:  # one broken section must not lose the others' numbers
                report["sections"][name] = dict(error=f"{type(error).__name__}: {str(error)[:2000]}")
        report["sections"][name]["seconds"] = time.monotonic() - start
        print(f"[{name}] done in {report['sections'][name]['seconds']:.0f} s", flush=True)
        report["failures"] = ctx.failures
        with open(flags.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    errors = [name for name, section in report["sections"].items() if "error" in section]
    print(f"{'FAIL' if ctx.failures or errors else 'PASS'}: {len(ctx.failures)} rows over tolerance, "
          f"sections with errors: {errors or 'none'}", flush=True)
    if ctx.failures or errors:
        sys.exit(1)
