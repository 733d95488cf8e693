"""The native packed matmul against XLA:CPU's dot, at a model step's shapes, measured in the same run: float32, and
bfloat16 where the CPU has the packed bfloat16 kernel (AVX512-BF16).

Run: .venv/bin/python -m benchmarks.cpu_matmul [--repeats 9] [--rounds 3]

One jitted call holds a whole step's matmuls of SmolLM2-135M (30 layers of q, k, v, o, gate, up and down
projections, then the tied 49,152-row vocabulary projection): the weights (~0.5 GB in float32, half that in
bfloat16) are far bigger than the caches, so each call streams them from memory, as a step does. The same program
runs with the weights as XLA dot operands [inner, outer] and packed into panels for the native kernel
(jaxpaged/kernels/cpu_native/packed_matmul.py), at 64 rows (a decode step) and 512 (a prefill step). The two are
alternated round by round; medians of every repeat. Prints GFLOP/s and the packed/XLA ratio, and names the CPU.
"""

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.bench.machine_info import machine_info
from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packs_dtype
from jaxpaged.models.layers import matmul
from jaxpaged.timing import call_seconds

HIDDEN, INTERMEDIATE, Q_WIDTH, KV_WIDTH, VOCAB, LAYERS = 576, 1536, 576, 192, 49152, 30
LAYER_SHAPES = {"q": (HIDDEN, Q_WIDTH), "k": (HIDDEN, KV_WIDTH), "v": (HIDDEN, KV_WIDTH), "o": (Q_WIDTH, HIDDEN),
                "gate": (HIDDEN, INTERMEDIATE), "up": (HIDDEN, INTERMEDIATE), "down": (INTERMEDIATE, HIDDEN)}


def step_flops(rows: int) -> int:
    """Multiply-adds x 2 of one call: every layer's projections and the vocabulary projection."""
    per_layer = sum(inner * outer for inner, outer in LAYER_SHAPES.values())
    return 2 * rows * (LAYERS * per_layer + HIDDEN * VOCAB)


def step_matmuls(x, layers, head):
    """A step's matmuls in a step's order; the small residual keeps the values bounded and each layer dependent on
    the last (XLA cannot reorder or drop any)."""
    h = x
    for w in layers:
        q, k, v = matmul(h, w["q"]), matmul(h, w["k"]), matmul(h, w["v"])
        attention = matmul(q + 0.01 * jnp.tile(k + v, (1, Q_WIDTH // KV_WIDTH)), w["o"])
        mlp = matmul(jax.nn.silu(matmul(h, w["gate"])) * matmul(h, w["up"]), w["down"])
        h = h + 1e-3 * (attention + mlp)
    return matmul(h, head)


def main() -> None:
    parser = argparse.ArgumentParser(description="Packed native matmul vs XLA:CPU dot at a step's shapes.")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    machine = machine_info()
    print(f"{machine.get('cpu')} ({machine.get('num_cpus')} cpus), JAX {jax.__version__} on {jax.default_backend()}")
    results = {"cpu": machine.get("cpu"), "rows": []}
    print("| dtype | rows | XLA dot GFLOP/s | packed GFLOP/s | packed / XLA |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for dtype in ("float32", "bfloat16"):
        if not packs_dtype(dtype):
            print(f"| {dtype} | – | – | – | no packed kernel for {dtype} on this CPU |")
            continue
        host_layers = [{name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)
                        for name, shape in LAYER_SHAPES.items()} for _ in range(LAYERS)]
        host_head = (rng.standard_normal((HIDDEN, VOCAB)) / np.sqrt(HIDDEN)).astype(dtype)
        weights = {
            "xla": ([{n: jnp.asarray(w) for n, w in layer.items()} for layer in host_layers], jnp.asarray(host_head)),
            "packed": ([{n: jnp.asarray(pack_panels(w)) for n, w in layer.items()} for layer in host_layers],
                       jnp.asarray(pack_panels(host_head))),
        }
        for rows in (64, 512):
            x = jnp.asarray(rng.standard_normal((rows, HIDDEN)).astype(dtype))
            compiled = {path: jax.jit(step_matmuls).lower(x, *weights[path]).compile() for path in weights}
            outputs = {path: np.asarray(compiled[path](x, *weights[path])).astype(np.float32) for path in weights}
            tolerance = 1e-3 if dtype == "float32" else 5e-2  # bfloat16 layer outputs may round a unit apart
            np.testing.assert_allclose(outputs["packed"], outputs["xla"], rtol=tolerance, atol=tolerance)
            seconds: dict[str, list[float]] = {path: [] for path in weights}
            for _ in range(args.rounds):
                for path in weights:
                    seconds[path] += call_seconds(
                        lambda: compiled[path](x, *weights[path]).block_until_ready(), args.repeats)  # noqa: B023
            rate = {path: step_flops(rows) / statistics.median(times) / 1e9 for path, times in seconds.items()}
            print(f"| {dtype} | {rows} | {rate['xla']:.1f} | {rate['packed']:.1f} | "
                  f"{rate['packed'] / rate['xla']:.2f} |")
            results["rows"].append({"dtype": dtype, "rows": rows, "xla_gflop_per_s": rate["xla"],
                                    "packed_gflop_per_s": rate["packed"]})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
