"""Times the "xla" (pure-jnp) attention backend on CPU: decode and prefill steps of a small model.

Run: .venv/bin/python benchmarks/kernels/cpu_reference_bench.py [--num-layers 30] [--pages-per-chunk 4]
Prints milliseconds per step for all layers (one call per layer), jitted, after warm-up.
"""

import argparse
import functools
import time

import jax
import numpy as np

from jaxpaged.kernels.xla_attention import ragged_paged_attention_xla
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch

# (name, q_lens, kv_lens, num_tokens bucket, max_num_seqs bucket)
WORKLOADS = [
    ("decode 64 seqs, kv ~300", [1] * 64, [260 + (s * 37) % 80 for s in range(64)], 64, 64),
    ("prefill 1 x 512", [512], [512], 512, 64),
    ("mixed 1 x 448 prefill + 63 decodes", [448] + [1] * 63, [448] + [300] * 63, 512, 64),
]


def time_workload(q_lens, kv_lens, num_tokens, max_num_seqs, *, num_layers, pages_per_chunk,
                  repeats) -> float:
    """Milliseconds for num_layers back-to-back attention calls (median over repeats)."""
    batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=9, num_kv_heads=3, head_dim=64,
                              page_size=16, num_tokens=num_tokens, max_num_seqs=max_num_seqs,
                              pages_per_seq=128, num_pages=2048)
    attend = jax.jit(functools.partial(ragged_paged_attention_xla, sm_scale=0.125,
                                       pages_per_chunk=pages_per_chunk))
    args = batch.attention_args()
    attend(*args).block_until_ready()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(num_layers):
            out = attend(*args)
        out.block_until_ready()
        timings.append(time.perf_counter() - start)
    return 1e3 * float(np.median(timings))


def main() -> None:
    """Parse flags, time each workload, print a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-layers", type=int, default=30)
    parser.add_argument("--pages-per-chunk", type=int, nargs="+", default=[4])
    parser.add_argument("--repeats", type=int, default=3)
    flags = parser.parse_args()
    print(f"backend {jax.default_backend()}, {flags.num_layers} layers, 9 q / 3 kv heads, "
          "head_dim 64, page 16, float32")
    for pages_per_chunk in flags.pages_per_chunk:
        for name, q_lens, kv_lens, num_tokens, max_num_seqs in WORKLOADS:
            ms = time_workload(q_lens, kv_lens, num_tokens, max_num_seqs, num_layers=flags.num_layers,
                               pages_per_chunk=pages_per_chunk, repeats=flags.repeats)
            print(f"pages_per_chunk={pages_per_chunk:2d}  {name:38s} {ms:9.1f} ms")


if __name__ == "__main__":
    main()
