"""The MoE block alone at a decode step's shapes (benchmarks/moe_dense_step.py's random Qwen3-MoE: hidden 1024, 64
experts of width 256, top 8, 12 layers, float32) against its dense twin's MLP, measured in the same run.

Run: python -m benchmarks.moe_block [--tokens 1] [--repeats 30] [--rounds 3] [--dtype float32]

One jitted function runs the 12 layers' blocks one after another on `--tokens` tokens, each on the one before's
output (each layer its own weights and its own fixed routing, so the touched experts come from memory: 12 layers'
touched experts are ~300 MB in float32, far past the caches). Paths, alternated round by round so that they see
the same load:
  - moe block: models/moe.py experts_forward (sort, gathers, the grouped matmuls, the combine), as the step runs it;
  - grouped matmuls: only the grouped-matmul calls experts_forward makes (gate and up, then down), on rows already
    sorted;
  - dense MLP, packed: the twin's gated MLP (one [1024, 2048] gate, up and down) by layers.gated_mlp on weights packed
    into panels, the path the dense engine's step runs;
  - dense MLP, XLA dot: the same MLP by XLA's dot on weights as stored.
The MoE paths' rate is the touched experts' bytes (each distinct expert of a layer once, its three matrices) per
second; the dense paths' is the MLP's bytes per second (the same bytes at one token). Medians; prints the CPU and
the load average before and after, and a JSON line at the end.
"""

import argparse
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.bench.machine_info import load_average, machine_info
from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_matmul_available
from jaxpaged.models import moe
from jaxpaged.models.layers import gated_mlp
from jaxpaged.models.moe import ExpertWeights, MoeRouting, experts_forward, route
from jaxpaged.timing import call_seconds

HIDDEN, WIDTH, EXPERTS, TOP_K, LAYERS = 1024, 256, 64, 8, 12
RESIDUAL_SCALE = 0.01
"""Each layer's output is added to its input, as a decoder's residual stream does: a layer waits for the one before
(independent layers would let XLA run several layers' calls at once, which no step does)."""


def moe_layers(rng: np.random.Generator, dtype) -> list[ExpertWeights]:
    """LAYERS layers of random experts, each [EXPERTS, in, out], on the device."""
    scale = 1 / np.sqrt(HIDDEN)

    def stack(inner: int, outer: int) -> jax.Array:
        return jnp.asarray((rng.standard_normal((EXPERTS, inner, outer), np.float32) * scale).astype(dtype))

    return [ExpertWeights(stack(HIDDEN, WIDTH), stack(HIDDEN, WIDTH), stack(WIDTH, HIDDEN)) for _ in range(LAYERS)]


def dense_layers(rng: np.random.Generator, dtype, packed: bool) -> list[tuple[jax.Array, ...]]:
    """LAYERS dense MLPs of width TOP_K * WIDTH (the MoE's active parameters), as stored or packed into panels."""
    scale, width = 1 / np.sqrt(HIDDEN), TOP_K * WIDTH
    layers = []
    for _ in range(LAYERS):
        mats = [(rng.standard_normal(shape, np.float32) * scale).astype(dtype)
                for shape in ((HIDDEN, width), (HIDDEN, width), (width, HIDDEN))]
        layers.append(tuple(jnp.asarray(pack_panels(m) if packed else m) for m in mats))
    return layers


def main() -> None:
    parser = argparse.ArgumentParser(description="The MoE block alone at a decode step's shapes, vs the dense MLP.")
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--paths", nargs="*", default=["moe block", "grouped matmuls", "dense MLP, packed",
                                                        "dense MLP, XLA dot"])
    args = parser.parse_args()
    dtype = jnp.dtype(args.dtype)
    machine = machine_info()
    load_before = load_average()
    print(f"{machine.get('cpu')} ({machine.get('num_cpus')} cpus), JAX {jax.__version__}, load {load_before}")
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((args.tokens, HIDDEN), np.float32).astype(dtype))
    num_rows = jnp.int32(args.tokens)
    routing = MoeRouting(EXPERTS, TOP_K, renormalize=True)
    routes = [route(jnp.asarray(rng.standard_normal((args.tokens, EXPERTS), np.float32)), routing)
              for _ in range(LAYERS)]
    touched = sum(len(np.unique(np.asarray(ids))) for _, ids in routes)
    moe_bytes = touched * 3 * HIDDEN * WIDTH * dtype.itemsize
    dense_bytes = LAYERS * 3 * HIDDEN * TOP_K * WIDTH * dtype.itemsize
    paths, rates = {}, {}
    if {"moe block", "grouped matmuls"} & set(args.paths):
        experts = moe_layers(rng, dtype)

        def moe_block(x, experts):
            for (weights, ids), layer in zip(routes, experts):
                x = x + RESIDUAL_SCALE * experts_forward(x, weights, ids, layer, num_rows).astype(x.dtype)
            return x

        def grouped_only(x, experts):
            rows = jnp.repeat(x, TOP_K, axis=0)  # the sort's gather, once: here only the grouped matmuls are timed
            for (_, ids), layer in zip(routes, experts):
                flat = ids.reshape(-1)
                sizes = jnp.zeros(EXPERTS, jnp.int32).at[flat].add(1)
                gate, up = moe.expert_matmul_pair(rows, layer.gate, layer.up, sizes)
                rows = rows + RESIDUAL_SCALE * moe.expert_matmul(moe.silu_gated(gate, up), layer.down, sizes)
            return rows

        if "moe block" in args.paths:
            paths["moe block"] = (jax.jit(moe_block), (x, experts))
            rates["moe block"] = moe_bytes
        if "grouped matmuls" in args.paths:
            paths["grouped matmuls"] = (jax.jit(grouped_only), (x, experts))
            rates["grouped matmuls"] = moe_bytes
    for name, packed in (("dense MLP, packed", True), ("dense MLP, XLA dot", False)):
        if name not in args.paths or (packed and not packed_matmul_available()):
            continue
        layers = dense_layers(rng, dtype, packed)

        def dense(x, layers):
            for gate, up, down in layers:
                x = x + RESIDUAL_SCALE * gated_mlp(x, gate, up, down)
            return x

        paths[name] = (jax.jit(dense), (x, layers))
        rates[name] = dense_bytes
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, (function, operands) in paths.items():
            times[name] += call_seconds(lambda f=function, o=operands: f(*o).block_until_ready(), args.repeats)
    result = {"cpu": machine.get("cpu"), "tokens": args.tokens, "dtype": args.dtype, "touched_experts": touched,
              "load_before": load_before, "load_after": load_average(), "paths": {}}
    print(f"{args.tokens} token(s), {args.dtype}, {touched} touched experts over {LAYERS} layers "
          f"({moe_bytes / 1e6:.0f} MB; the dense MLPs {dense_bytes / 1e6:.0f} MB)")
    print("| path | median ms | GB/s |")
    print("|---|---|---|")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median * 1e3:.2f} | {rates[name] / median / 1e9:.1f} |")
        result["paths"][name] = {"ms": median * 1e3, "gb_per_s": rates[name] / median / 1e9}
    print(f"load {load_before} -> {result['load_after']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
