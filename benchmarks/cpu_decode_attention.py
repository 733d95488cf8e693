"""Decode attention on the CPU against the machine's copy bandwidth, measured in the same run.

Run: .venv/bin/python -m benchmarks.cpu_decode_attention [--repeats 7] [--layers 30] [--kv-dtype bfloat16]
     .venv/bin/python -m benchmarks.cpu_decode_attention --compare float32,bfloat16,int8,fp8_e4m3 [--rounds 5]

SmolLM2-135M shapes (9 q heads, 3 kv heads, head_dim 64, 16-token pages, pages scattered over the pool), 64 decoding
sequences at 200 and at 1,000 KV tokens; `--layers` attention calls per jitted call (one step's worth, so dispatch
does not count). Reports the useful KV bytes each call must read (every K and V of every sequence, in the pool's
dtype: float32, or bfloat16 as the engine keeps it for bfloat16 models, or int8 / fp8 codes and their scales) per
second, as a fraction of a numpy copy's bandwidth (bytes copied per second, an array far bigger than the caches),
for the native kernel and for the jnp path (JAXPAGED's chunked gather), and one prefill of 512 tokens for both (on
the CPU the native kernel serves prefill rows too, a block of a chunk's rows at a time). Medians of the repeats;
the CPU is named.
"""

import argparse
import json
import statistics

import jax
import jax.numpy as jnp

from jaxpaged.bench.machine_info import machine_info
from jaxpaged.bench.roofline import copy_bytes_per_s
from jaxpaged.kernels import xla_attention
from jaxpaged.timing import call_seconds
from pallas_kernels.bfloat16_bits import to_bits
from pallas_kernels.kv_quantization import SCALE_BYTES, quantize_rows, quantized_pool_dtype
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 9, 3, 64, 16


KV_DTYPES = ("float32", "bfloat16", "int8", "fp8_e4m3")
"""Pool formats: float32, bfloat16 (held as its bits, as the engine holds it), or quantized rows of codes and a scale
(kv_cache_dtype int8 / fp8_e4m3)."""


def as_pool(kv_pages: jax.Array, kv_dtype: str) -> jax.Array:
    """The float pages as the engine stores them in `kv_dtype`."""
    if kv_dtype in ("int8", "fp8_e4m3"):
        return quantize_rows(kv_pages, quantized_pool_dtype(kv_dtype))
    return to_bits(kv_pages.astype(kv_dtype))


def kv_bytes_per_value(kv_dtype: str) -> float:
    """Pool bytes per K or V value, a quantized row's scale included."""
    if kv_dtype in ("int8", "fp8_e4m3"):
        return (HEAD_DIM + SCALE_BYTES) / HEAD_DIM
    return jnp.dtype(kv_dtype).itemsize


def time_attention(q_lens: list[int], kv_lens: list[int], num_tokens: int, *, layers: int, repeats: int,
                   native: bool, kv_dtype: str = "float32", min_pool_bytes: int = 256 * 2**20) -> float:
    """Median seconds of one attention call (see compile_attention)."""
    call = compile_attention(q_lens, kv_lens, num_tokens, layers=layers, native=native, kv_dtype=kv_dtype,
                             min_pool_bytes=min_pool_bytes)
    return statistics.median(call_seconds(call, repeats)) / layers


def compile_attention(q_lens: list[int], kv_lens: list[int], num_tokens: int, *, layers: int, native: bool,
                      kv_dtype: str = "float32", min_pool_bytes: int = 256 * 2**20):
    """A call of `layers` attention calls, a jitted scan as in a model step, ready to time. Each call reads
    another copy of the pages (copies cycle through at least min_pool_bytes, so the caches cannot hold them) and
    depends on the previous call's output (so XLA cannot hoist it out of the loop)."""
    pages_per_seq = -(-max(kv_lens) // PAGE)
    num_pages = len(kv_lens) * pages_per_seq + 1
    batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=NUM_Q_HEADS, num_kv_heads=NUM_KV_HEADS,
                              head_dim=HEAD_DIM, page_size=PAGE, num_tokens=num_tokens, max_num_seqs=64,
                              pages_per_seq=pages_per_seq, num_pages=num_pages)
    q, kv_pages, metadata = batch.attention_args()
    kv_pages = as_pool(kv_pages, kv_dtype)
    num_copies = max(1, min(layers, -(-min_pool_bytes // kv_pages.nbytes)))
    pool = jnp.tile(kv_pages, (num_copies, 1, 1, 1))
    def step(q, pool, metadata):
        def layer(carry, index):
            shifted = metadata.on_pages_from((index % num_copies) * num_pages, PAGE)
            out = xla_attention.ragged_paged_attention_xla(q + carry * 1e-9, pool, shifted, sm_scale=0.125,
                                                 native=native)
            return out[0, 0, 0], None
        return jax.lax.scan(layer, jnp.float32(0), jnp.arange(layers, dtype=jnp.int32))[0]

    compiled = jax.jit(step).lower(q, pool, metadata).compile()
    return lambda: compiled(q, pool, metadata).block_until_ready()


def compare_formats(kv_dtypes: list[str], *, layers: int, repeats: int, rounds: int) -> list[dict]:
    """Native decode of 64 sequences at 1,000 KV tokens in each pool format, the formats alternated round by round
    (so a busy machine slows them alike); the medians over rounds of each round's median, and each format's time over
    the first's."""
    calls = {kv_dtype: compile_attention([1] * 64, [1000] * 64, 64, layers=layers, native=True, kv_dtype=kv_dtype)
             for kv_dtype in kv_dtypes}
    seconds: dict[str, list[float]] = {kv_dtype: [] for kv_dtype in kv_dtypes}
    for _ in range(rounds):
        for kv_dtype, call in calls.items():
            seconds[kv_dtype].append(statistics.median(call_seconds(call, repeats)) / layers)
    medians = {kv_dtype: statistics.median(values) for kv_dtype, values in seconds.items()}
    first = medians[kv_dtypes[0]]
    return [{"kv_dtype": kv_dtype, "ms": median * 1e3, "over_first": median / first,
             "kv_bytes": 64 * 1000 * 2 * NUM_KV_HEADS * HEAD_DIM * kv_bytes_per_value(kv_dtype)}
            for kv_dtype, median in medians.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description="Decode attention on the CPU against its copy bandwidth.")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default="float32",
                        help="the KV pool's format (the engine's for float32 / bfloat16 models, or kv_cache_dtype)")
    parser.add_argument("--compare", default=None,
                        help="comma-separated formats (float32,bfloat16,int8): only native decode at 1,000 tokens, "
                             "the formats alternated over --rounds")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    machine = machine_info()
    if args.compare:
        rows = compare_formats(args.compare.split(","), layers=args.layers, repeats=args.repeats, rounds=args.rounds)
        print(f"{machine.get('cpu')} ({machine.get('num_cpus')} cpus); native decode 64 x 1000, alternated over "
              f"{args.rounds} rounds, medians")
        print("| KV format | KV MB read | ms per layer | time over " + rows[0]["kv_dtype"] + " |")
        print("|---|---|---|---|")
        for row in rows:
            print(f"| {row['kv_dtype']} | {row['kv_bytes'] / 1e6:.1f} | {row['ms']:.3f} | {row['over_first']:.2f} |")
        print(json.dumps({"cpu": machine.get("cpu"), "compare": rows}))
        return
    bandwidth = copy_bytes_per_s(args.repeats, statistics.median)
    print(f"{machine.get('cpu')} ({machine.get('num_cpus')} cpus), JAX {jax.__version__} on "
          f"{jax.default_backend()}; numpy copy {bandwidth / 1e9:.2f} GB/s; {args.kv_dtype} KV")
    results = {"cpu": machine.get("cpu"), "copy_gb_per_s": bandwidth / 1e9, "kv_dtype": args.kv_dtype,
               "decode": [], "prefill": []}
    kv_itemsize = kv_bytes_per_value(args.kv_dtype)
    print("| workload | path | ms per layer | useful KV GB/s | of copy bandwidth |")
    print("|---|---|---|---|---|")
    for kv_tokens in (200, 1000):
        useful_bytes = 64 * kv_tokens * 2 * NUM_KV_HEADS * HEAD_DIM * kv_itemsize
        for native in (True, False):
            seconds = time_attention([1] * 64, [kv_tokens] * 64, 64, layers=args.layers, repeats=args.repeats,
                                     native=native, kv_dtype=args.kv_dtype)
            rate = useful_bytes / seconds
            path = "native" if native else "jnp"
            print(f"| decode 64 x {kv_tokens} | {path} | {seconds * 1e3:.3f} | {rate / 1e9:.2f} | "
                  f"{rate / bandwidth:.0%} |")
            results["decode"].append({"kv_tokens": kv_tokens, "path": path, "ms": seconds * 1e3,
                                      "gb_per_s": rate / 1e9, "fraction_of_copy": rate / bandwidth})
    for native in (True, False):
        seconds = time_attention([512], [512], 512, layers=max(1, args.layers // 10), repeats=args.repeats,
                                 native=native, kv_dtype=args.kv_dtype)
        path = "native" if native else "jnp"
        print(f"| prefill 1 x 512 | {path} | {seconds * 1e3:.3f} | – | – |")
        results["prefill"].append({"path": path, "ms": seconds * 1e3})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
