"""One projection's LoRA product at 64 decode rows on the CPU: the dense form over all slots (lora/projection.py
lora_delta, what the model runs) against a gather of each row's A and B (lora_delta_by_gather), alternated in one
run, beside the base matmul itself. Shapes: SmolLM2-135M-like (hidden 576, MLP 1536) and a 4096 one, 4 adapters +
slot 0, rank 16, float32.

    python -m benchmarks.lora_delta [--repeats 200]
"""

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.bench.machine_info import machine_info
from jaxpaged.lora.projection import LoRAProjection, lora_delta, lora_delta_by_gather, row_slot_one_hot

ROWS, SLOTS, RANK = 64, 5, 16


def median_us(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"CPU: {machine_info().get('cpu')}  cores: {os.cpu_count()}  load: {os.getloadavg()}")
    for inner, outer in ((576, 576), (576, 1536), (1536, 576), (4096, 4096)):
        x = jnp.asarray(rng.normal(size=(ROWS, inner)), jnp.float32)
        weight = jnp.asarray(rng.normal(size=(inner, outer)), jnp.float32)
        a = jnp.asarray(rng.normal(size=(SLOTS, RANK, inner)), jnp.float32)
        b = jnp.asarray(rng.normal(size=(SLOTS, outer, RANK)), jnp.float32)
        slots = jnp.asarray(rng.integers(0, SLOTS, ROWS), jnp.int32)

        def dense(x, weight, a, b, slots):
            return x @ weight + lora_delta(x, LoRAProjection(None, a, b, row_slot_one_hot(slots, SLOTS, x.dtype)))

        def gathered(x, weight, a, b, slots):
            return x @ weight + lora_delta_by_gather(x, LoRAProjection(None, a, b, jnp.zeros((0, 0))), slots)

        base = jax.jit(lambda x, weight, a, b, slots: x @ weight)
        times = {"base": [], "dense": [], "gather": []}
        functions = {"base": base, "dense": jax.jit(dense), "gather": jax.jit(gathered)}
        for _ in range(5):  # alternated, so load changes hit all three alike
            for name, fn in functions.items():
                times[name].append(median_us(fn, (x, weight, a, b, slots), args.repeats // 5))
        result = {name: statistics.median(values) for name, values in times.items()}
        print(f"{inner:>5} -> {outer:<5} base {result['base']:8.1f} us   base + dense LoRA {result['dense']:8.1f} us"
              f"   base + gathered LoRA {result['gather']:8.1f} us")


if __name__ == "__main__":
    main()
