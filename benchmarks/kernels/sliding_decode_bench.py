"""A sliding-window layer's decode time at long context against short, on the CPU: it must not grow with the context.

Run: .venv/bin/python -m benchmarks.kernels.sliding_decode_bench [--contexts 2048 32768] [--rounds 5] [--repeats 5]
     [--shape 32,16,128] [--window 1024] [--seqs 8] [--kv-dtype bfloat16]

One decode step of `--seqs` sequences, each at `context` tokens, through a sliding layer (Gemma-3-27B's attention by
default: 32 q heads, 16 kv heads, head_dim 128, window 1024, 16-token pages), as the KV cache groups keep it: only the
pages holding the window are real, every table entry before them is the null page 0 (the pages were freed), and the
table is as wide as the context. Both CPU paths of the "xla" backend: the native kernel and the jnp passes. Reports
the median (and fastest) milliseconds of one call per context and path, the contexts alternated round by round, and
each path's ratio of its longest context to its shortest (goal: within 1.2); the CPU and its load are named.
"""

import argparse
import json
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.bench.machine_info import machine_info
from jaxpaged.kernels import xla_attention
from jaxpaged.timing import call_seconds
from pallas_kernels.bfloat16_bits import to_bits
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata

PAGE = 16


def window_step(context: int, *, num_seqs: int, num_q_heads: int, num_kv_heads: int, head_dim: int, window: int,
                kv_dtype: str, seed: int = 0) -> tuple:
    """(q, kv_pages, metadata) of `num_seqs` decodes at `context` tokens whose tables hold only the window's pages
    (random ids) and the null page before them."""
    rng = np.random.default_rng(seed)
    pages_per_seq = -(-context // PAGE)
    first_page = max(context - window, 0) // PAGE  # the page of the decode row's first visible token
    live = pages_per_seq - first_page
    num_pages = 1 + num_seqs * live
    ids = rng.permutation(np.arange(1, num_pages)).reshape(num_seqs, live).astype(np.int32)
    tables = np.zeros((num_seqs, pages_per_seq), np.int32)
    tables[:, first_page:] = ids
    kv = rng.standard_normal((num_pages, PAGE, 2 * num_kv_heads, head_dim), np.float32)
    kv_pages = jnp.asarray(kv) if kv_dtype == "float32" else to_bits(jnp.asarray(kv).astype(kv_dtype))
    q = jnp.asarray(rng.standard_normal((num_seqs, num_q_heads, head_dim), np.float32)).astype(
        jnp.float32 if kv_dtype == "float32" else jnp.bfloat16)
    metadata = AttentionMetadata(slot_mapping=jnp.zeros(num_seqs, jnp.int32),
                                 kv_lens=jnp.full(num_seqs, context, jnp.int32), block_tables=jnp.asarray(tables),
                                 cu_q_lens=jnp.arange(num_seqs + 1, dtype=jnp.int32),
                                 num_seqs=jnp.array([num_seqs], jnp.int32))
    return q, kv_pages, metadata


def decode_call(context: int, *, native: bool, window: int, **shape) -> Callable[[], object]:
    """One compiled sliding-window decode call at `context` tokens, returning once its result is ready."""
    q, kv_pages, metadata = window_step(context, window=window, **shape)
    head_dim = q.shape[-1]
    attend = jax.jit(lambda q, kv_pages, metadata: xla_attention.ragged_paged_attention_xla(
        q, kv_pages, metadata, sm_scale=head_dim ** -0.5, sliding_window=window, native=native))
    return lambda: attend(q, kv_pages, metadata).block_until_ready()


def time_contexts(contexts: list[int], *, rounds: int, repeats: int, **options) -> dict[int, list[float]]:
    """Seconds of every call per context, the contexts alternated round by round (a shared machine's load then
    falls on all of them alike)."""
    calls = {context: decode_call(context, **options) for context in contexts}
    seconds: dict[int, list[float]] = {context: [] for context in contexts}
    for _ in range(rounds):
        for context, call in calls.items():
            seconds[context] += call_seconds(call, repeats)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A sliding-window layer's decode time at long and short context.")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 32768])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="calls per context and round")
    parser.add_argument("--shape", default="32,16,128", help="q heads, kv heads, head_dim")
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--kv-dtype", default="bfloat16", choices=("float32", "bfloat16"))
    options = parser.parse_args(argv)
    num_q_heads, num_kv_heads, head_dim = (int(n) for n in options.shape.split(","))
    shape = dict(num_seqs=options.seqs, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                 kv_dtype=options.kv_dtype)
    machine = machine_info()
    print(f"{machine['cpu']} ({machine['num_cpus']} CPUs), load {machine['load_average']}; shape {options.shape}, "
          f"window {options.window}, {options.seqs} decodes, {options.kv_dtype} pool", flush=True)
    results = {}
    for path, native in (("native", True), ("jnp", False)):
        seconds = time_contexts(options.contexts, rounds=options.rounds, repeats=options.repeats, native=native,
                                window=options.window, **shape)
        ms = {context: 1e3 * statistics.median(values) for context, values in seconds.items()}
        fastest = {context: 1e3 * min(values) for context, values in seconds.items()}
        longest, shortest = max(ms), min(ms)
        results[path] = dict(ms=ms, fastest_ms=fastest, ratio=ms[longest] / ms[shortest],
                             fastest_ratio=fastest[longest] / fastest[shortest])
        cells = ", ".join(f"{context}: {ms[context]:.3f} ms (fastest {fastest[context]:.3f})" for context in ms)
        print(f"{path:6s} {cells}; {longest} / {shortest} = {results[path]['ratio']:.2f}x median, "
              f"{results[path]['fastest_ratio']:.2f}x fastest", flush=True)
    print(json.dumps(dict(machine=machine, options=vars(options), results=results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
