"""Weight-only int8 on the native bfloat16-dot matmul against float32 panels and the other weight-only int8 paths,
one projection shape at a time.

Run: python -m benchmarks.quantization.int8_bf16_matmul [--rows 1 8 64] [--repeats 5] [--rounds 5]

For each of SmolLM2-135M's projection shapes (576x576 q/o, 576x192 k/v, 576x1536 gate/up, 1536x576 down), one call
multiplies the same rows by 30 distinct random weights of that shape (a model's layers: the weights come from memory,
not from the cache of the call before), in each form: float32 panels (the default CPU path), int8 panels widened to
float32 ("panels"), int16 digits on the native VNNI matmul ("vnni digits", where the CPU has VPDPBUSD) and int8
panels widened to bfloat16 against bfloat16-rounded rows ("bf16 panels", kernels/cpu_native/int8_bf16_matmul.py).
The paths take turns round by round; ms per call are medians of every repeat. Prints the CPU, the load average
before and after, and each path's speed as a multiple of float32's, and checks that "bf16 panels" agrees with the
float32-input int8 panels to bfloat16's rounding of the rows.
"""

import argparse
import json
import statistics

import jax
import numpy as np

from benchmarks.cpu_matmul import HIDDEN, INTERMEDIATE, KV_WIDTH, LAYERS
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.kernels.cpu_native.int8_bf16_matmul import int8_bf16_available, pack_int8_pairs
from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_int8_available, packed_matmul_available
from jaxpaged.kernels.cpu_native.vnni_matmul import pack_vnni, vnni_available
from jaxpaged.models.int8_bf16_weights import Int8Bf16Weight
from jaxpaged.models.int8_weights import Int8Weight, quantize_int8
from jaxpaged.models.int16_activations import VnniW8A16Weight
from jaxpaged.models.layers import matmul
from jaxpaged.timing import call_seconds

SHAPES = ((HIDDEN, HIDDEN), (HIDDEN, KV_WIDTH), (HIDDEN, INTERMEDIATE), (INTERMEDIATE, HIDDEN))


def _forms(rng: np.random.Generator, inner: int, outer: int) -> dict[str, list]:
    """LAYERS random weights of one shape in each path's form (the same quantized values in every int8 form)."""
    host = [(rng.standard_normal((inner, outer)) / np.sqrt(inner)).astype(np.float32) for _ in range(LAYERS)]
    quantized = [quantize_int8(w) for w in host]
    forms = {
        "float32 panels": [jax.numpy.asarray(pack_panels(w)) for w in host],
        "panels": [Int8Weight(jax.numpy.asarray(pack_panels(q)), jax.numpy.asarray(s)) for q, s in quantized],
        "bf16 panels": [Int8Bf16Weight(jax.numpy.asarray(pack_int8_pairs(q)), jax.numpy.asarray(s))
                        for q, s in quantized],
    }
    if vnni_available():
        forms["vnni digits"] = [VnniW8A16Weight(jax.numpy.asarray(pack_vnni(q)), jax.numpy.asarray(s))
                                for q, s in quantized]
    return forms


def _every_weight(x, weights):
    return [matmul(x, w) for w in weights]


def main() -> None:
    parser = argparse.ArgumentParser(description="int8 on the bfloat16 dot vs float32 and int8 panels, per shape.")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    assert packed_matmul_available() and packed_int8_available() and int8_bf16_available(), "a kernel is missing"
    print(describe_machine(machine_info()), "load", load_average())
    results = []
    for inner, outer in SHAPES:
        forms = _forms(np.random.default_rng(inner + outer), inner, outer)
        paths = list(forms)
        print(f"\n{inner}x{outer}, {LAYERS} weights per call, ms per call")
        print("| rows | " + " | ".join(paths) + " | vs float32: " + " / ".join(paths[1:]) + " |")
        print("|---|" + "---|" * (len(paths) + 1))
        for rows in args.rows:
            x = jax.numpy.asarray(np.random.default_rng(rows).standard_normal((rows, inner)).astype(np.float32))
            compiled = {path: jax.jit(_every_weight).lower(x, forms[path]).compile() for path in paths}
            int8, bf16 = (np.asarray(compiled[p](x, forms[p])[0]) for p in ("panels", "bf16 panels"))
            np.testing.assert_allclose(bf16, int8, rtol=0.05, atol=0.05 * float(np.abs(int8).max()))
            seconds: dict[str, list[float]] = {path: [] for path in paths}
            for _ in range(args.rounds):
                for path in paths:
                    seconds[path] += call_seconds(
                        lambda: jax.block_until_ready(compiled[path](x, forms[path])), args.repeats)  # noqa: B023
            ms = {path: 1e3 * statistics.median(times) for path, times in seconds.items()}
            ratios = " / ".join(f"{ms['float32 panels'] / ms[path]:.2f}x" for path in paths[1:])
            print(f"| {rows} | " + " | ".join(f"{ms[path]:.2f}" for path in paths) + f" | {ratios} |")
            results.append({"inner": inner, "outer": outer, "rows": rows, "ms": ms})
    print(json.dumps({"load_average": load_average(), "results": results}))


if __name__ == "__main__":
    main()
