"""w8a8 on the native VNNI matmul against w8a8 on XLA's int8 dot and float32 panels: a decode step's projections.

Run: python -m benchmarks.quantization.vnni_matmul [--rows 1 8 64] [--repeats 5] [--rounds 5]

SmolLM2-135M's 30 layers of projections (hidden 576, intermediate 1536: q, k, v fused, o, gate and up fused, down,
as llama.py runs them), each layer's input depending on the last, in four forms of the same random weights:
float32 panels (the default CPU path), weight-only int8 panels (widened to float32), w8a8 through XLA's int8 x int8
dot, and w8a8 through the native VNNI matmul (kernels/cpu_native/vnni_matmul.py). The paths take turns round by round
(the machine's load meets all of them alike); ms per call are medians of every repeat. Prints the CPU, the load
average before and after, and the ratios to float32. The two w8a8 paths must agree to float32 rounding.
"""

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cpu_matmul import LAYER_SHAPES, LAYERS, Q_WIDTH
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_int8_available, packed_matmul_available
from jaxpaged.kernels.cpu_native.vnni_matmul import pack_vnni, vnni_available
from jaxpaged.models.int8_activations import VnniW8A8Weight, W8A8Weight
from jaxpaged.models.int8_weights import Int8Weight, quantize_int8
from jaxpaged.models.layers import matmul, matmuls
from jaxpaged.timing import call_seconds


def projections(x, layers):
    """The layers' projections in a step's order; a small residual keeps each layer dependent on the last."""
    h = x
    for w in layers:
        q, k, v = matmuls(h, (w["q"], w["k"], w["v"]))
        attention = matmul(q + 0.01 * jnp.tile(k + v, (1, Q_WIDTH // k.shape[1])), w["o"])
        gate, up = matmuls(h, (w["gate"], w["up"]))
        h = h + 1e-3 * (attention + matmul(jax.nn.silu(gate) * up, w["down"]))
    return h


def _weights(rng: np.random.Generator) -> dict[str, list[dict]]:
    """The same random weights in each form."""
    host = [{name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
             for name, shape in LAYER_SHAPES.items()} for _ in range(LAYERS)]
    quantized = [{name: quantize_int8(w) for name, w in layer.items()} for layer in host]
    return {
        "float32 panels": [{n: jnp.asarray(pack_panels(w)) for n, w in layer.items()} for layer in host],
        "int8 panels": [{n: Int8Weight(jnp.asarray(pack_panels(q)), jnp.asarray(s)) for n, (q, s) in layer.items()}
                        for layer in quantized],
        "w8a8 XLA dot": [{n: W8A8Weight(jnp.asarray(q), jnp.asarray(s)) for n, (q, s) in layer.items()}
                         for layer in quantized],
        "w8a8 VNNI": [{n: VnniW8A8Weight(jnp.asarray(pack_vnni(q)), jnp.asarray(s)) for n, (q, s) in layer.items()}
                      for layer in quantized],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="w8a8 on VNNI vs XLA's int8 dot vs float32 at decode shapes.")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    assert packed_matmul_available() and packed_int8_available() and vnni_available(), "a native kernel is missing"
    print(describe_machine(machine_info()), "load", load_average())
    weights = _weights(np.random.default_rng(0))
    paths = list(weights)
    print("| rows | " + " | ".join(f"{path} ms" for path in paths) + " | vs float32: " + " / ".join(paths[1:]) + " |")
    print("|---|" + "---|" * (len(paths) + 1))
    results = []
    for rows in args.rows:
        x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, LAYER_SHAPES["q"][0])).astype(np.float32))
        compiled = {path: jax.jit(projections).lower(x, weights[path]).compile() for path in paths}
        outputs = {path: np.asarray(compiled[path](x, weights[path])) for path in paths}
        np.testing.assert_allclose(outputs["w8a8 VNNI"], outputs["w8a8 XLA dot"], rtol=1e-5, atol=1e-5)
        seconds: dict[str, list[float]] = {path: [] for path in paths}
        for _ in range(args.rounds):
            for path in paths:
                seconds[path] += call_seconds(
                    lambda: compiled[path](x, weights[path]).block_until_ready(), args.repeats)  # noqa: B023
        ms = {path: 1e3 * statistics.median(times) for path, times in seconds.items()}
        ratios = " / ".join(f"{ms['float32 panels'] / ms[path]:.2f}x" for path in paths[1:])
        print(f"| {rows} | " + " | ".join(f"{ms[path]:.2f}" for path in paths) + f" | {ratios} |")
        results.append({"rows": rows, "ms": ms})
    print(json.dumps({"load_average": load_average(), "rows": results}))


if __name__ == "__main__":
    main()
