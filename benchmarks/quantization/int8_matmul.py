"""A whole step's matmuls with int8 projections against float32 ones, at a model step's shapes, in the same run.

Run: python -m benchmarks.quantization.int8_matmul [--repeats 5] [--rounds 3]

benchmarks/cpu_matmul.py's program (SmolLM2-135M: 30 layers of q, k, v, o, gate, up and down, then the tied
49,152-row vocabulary projection, which stays float32 as in the engine) with the layers' weights as float32 panels
(the default CPU path), int8 panels with column scales (the native int8 matmul), unpacked int8 through XLA's dot
with the scales on its output, int8 with its inputs as int16 digits (XLA's int8 dot,
models/int16_activations.py; which weight-only int8 path the engine runs is timed at start-up,
runner/int8_probe.py), and w8a8 (rows quantized per token, XLA's int8 x int8 dot into int32); at
64 rows (a decode step) and 512 (a prefill step), alternated round by round, medians of every repeat.
Prints ms per call and the ratios to float32, and names the CPU.
"""

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cpu_matmul import HIDDEN, LAYER_SHAPES, LAYERS, VOCAB, step_matmuls
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_int8_available, packed_matmul_available
from jaxpaged.models.int8_activations import W8A8Weight
from jaxpaged.models.int8_weights import Int8Weight, quantize_int8
from jaxpaged.models.int16_activations import W8A16Weight
from jaxpaged.timing import call_seconds


def _weights(rng: np.random.Generator) -> dict[str, tuple[list[dict], jax.Array]]:
    """The same random weights in each form: (per-layer dicts, the packed float32 vocabulary projection)."""
    host = [{name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
             for name, shape in LAYER_SHAPES.items()} for _ in range(LAYERS)]
    head = jnp.asarray(pack_panels((rng.standard_normal((HIDDEN, VOCAB)) / np.sqrt(HIDDEN)).astype(np.float32)))
    quantized = [{name: quantize_int8(w) for name, w in layer.items()} for layer in host]
    return {
        "float32 panels": ([{n: jnp.asarray(pack_panels(w)) for n, w in layer.items()} for layer in host], head),
        "int8 panels": ([{n: Int8Weight(jnp.asarray(pack_panels(q)), jnp.asarray(s)) for n, (q, s) in layer.items()}
                         for layer in quantized], head),
        "int8 XLA dot": ([{n: Int8Weight(jnp.asarray(q), jnp.asarray(s)) for n, (q, s) in layer.items()}
                          for layer in quantized], head),
        "int8 int16 digits": ([{n: W8A16Weight(jnp.asarray(q), jnp.asarray(s)) for n, (q, s) in layer.items()}
                               for layer in quantized], head),
        "w8a8 XLA int8 dot": ([{n: W8A8Weight(jnp.asarray(q), jnp.asarray(s)) for n, (q, s) in layer.items()}
                               for layer in quantized], head),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="int8 against float32 projections at a step's shapes.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    assert packed_matmul_available() and packed_int8_available(), "the native kernels did not build"
    print(describe_machine(machine_info()), "load", load_average())
    weights = _weights(np.random.default_rng(0))
    paths = list(weights)
    print("| rows | " + " | ".join(f"{path} ms" for path in paths)
          + " | speed-up over float32: int8 panels / int16 digits / w8a8 |")
    print("|---|" + "---|" * (len(paths) + 1))
    results = []
    for rows in (64, 512):
        x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, HIDDEN)).astype(np.float32))
        compiled = {path: jax.jit(step_matmuls).lower(x, *weights[path]).compile() for path in paths}
        outputs = {path: np.asarray(compiled[path](x, *weights[path])) for path in paths}
        np.testing.assert_allclose(outputs["int8 panels"], outputs["int8 XLA dot"], rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(outputs["int8 int16 digits"], outputs["int8 XLA dot"], rtol=1e-3, atol=1e-3)
        seconds: dict[str, list[float]] = {path: [] for path in paths}
        for _ in range(args.rounds):
            for path in paths:
                seconds[path] += call_seconds(
                    lambda: compiled[path](x, *weights[path]).block_until_ready(), args.repeats)  # noqa: B023
        ms = {path: 1e3 * statistics.median(times) for path, times in seconds.items()}
        speedups = " / ".join(f"{ms['float32 panels'] / ms[path]:.2f}x"
                              for path in ("int8 panels", "int8 int16 digits", "w8a8 XLA int8 dot"))
        print(f"| {rows} | " + " | ".join(f"{ms[path]:.1f}" for path in paths) + f" | {speedups} |")
        results.append({"rows": rows, "ms": ms})
    print(json.dumps({"load_average": load_average(), "rows": results}))


if __name__ == "__main__":
    main()
