"""A/B of two builds of the packed matmul (packed_matmul.cc) on a W1 step's matmuls, alternated round by round.

Run: .venv/bin/python -m benchmarks.kernels.packed_matmul_ab DIR_A DIR_B [--rows 64,512] [--dtypes float32,bfloat16]
     [--rounds 5] [--repeats 5]

DIR_A and DIR_B each hold a copy of jaxpaged/kernels/cpu_native (packed_matmul.cc and the headers it includes), one
of them changed. Each is built and registered under its own target names; one jitted call runs a whole step's
matmuls of SmolLM2-135M (30 layers of q, k, v fused; o; gate, up fused; down; then the vocabulary projection at the
rows a step samples, at most 64), the weights streamed from memory as a step reads them. Prints each build's median
ms per call and GFLOP/s, B over A (>1: B faster), with wall and CPU time (CPU time: what a loaded machine inflates
least), and checks both builds' results agree.
"""

import argparse
import functools
import pathlib
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.bench.machine_info import machine_info
from jaxpaged.kernels.cpu_native.native_build import register
from jaxpaged.kernels.cpu_native.packed_matmul import FLAGS, PANEL_WIDTH, pack_panels

HIDDEN, INTER, Q_WIDTH, KV_WIDTH, VOCAB, LAYERS = 576, 1536, 576, 192, 49152, 30
LAYER_SHAPES = {"q": (HIDDEN, Q_WIDTH), "k": (HIDDEN, KV_WIDTH), "v": (HIDDEN, KV_WIDTH), "o": (Q_WIDTH, HIDDEN),
                "gate": (HIDDEN, INTER), "up": (HIDDEN, INTER), "down": (INTER, HIDDEN)}


def register_build(directory: pathlib.Path, label: str) -> dict[str, str]:
    """Registers the float32 and bfloat16-out handlers of `directory`'s packed_matmul.cc; dtype -> target name."""
    source = directory / "packed_matmul.cc"
    targets = {"float32": f"ab_{label}_f32", "bfloat16": f"ab_{label}_bf16"}
    assert register(source, FLAGS, "JaxpagedPackedMatmul", targets["float32"], "none")
    register(source, FLAGS, "JaxpagedPackedMatmulBfloat16Out", targets["bfloat16"], "none")
    return targets


def call(target: str, x, weights):
    """The packed matmuls of `weights` on x through `target` (packed_matmul.py's packed_matmuls, another target)."""
    shapes = [jax.ShapeDtypeStruct((x.shape[0], w.shape[0] * PANEL_WIDTH), x.dtype) for w in weights]
    return jax.ffi.ffi_call(target, shapes)(x, jnp.asarray(x.shape[0], jnp.int32), *weights)


def step(target: str, x, layers, head):
    """A step's matmuls in a step's order (the small residual keeps every layer dependent on the last)."""
    h = x
    for w in layers:
        q, k, v = call(target, h, [w["q"], w["k"], w["v"]])
        attention = call(target, (q + 0.01 * jnp.tile(k + v, (1, Q_WIDTH // KV_WIDTH))).astype(x.dtype), [w["o"]])[0]
        gate, up = call(target, h, [w["gate"], w["up"]])
        mlp = call(target, (jax.nn.silu(gate) * up).astype(x.dtype), [w["down"]])[0]
        h = (h + 1e-3 * (attention + mlp)).astype(x.dtype)
    return call(target, h[:64], [head])[0]


def seconds_of(function, repeats: int) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of `function` over `repeats` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        function()
        end_cpu = resource.getrusage(resource.RUSAGE_SELF)
        walls.append(time.perf_counter() - start)
        cpus.append(end_cpu.ru_utime + end_cpu.ru_stime - start_cpu.ru_utime - start_cpu.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description="A/B of two packed matmul builds on a W1 step's matmuls.")
    parser.add_argument("build_a", type=pathlib.Path)
    parser.add_argument("build_b", type=pathlib.Path)
    parser.add_argument("--rows", default="64,512")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    builds = {"A": register_build(args.build_a, "a"), "B": register_build(args.build_b, "b")}
    print(f"{machine_info().get('cpu')}; A {args.build_a}, B {args.build_b}")
    print("| dtype | rows | A ms | B ms | B / A wall (>1: B faster) | B / A CPU time |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for dtype in args.dtypes.split(","):
        layers = [{name: jnp.asarray(pack_panels((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)))
                   for name, shape in LAYER_SHAPES.items()} for _ in range(LAYERS)]
        head = jnp.asarray(pack_panels((rng.standard_normal((HIDDEN, VOCAB)) / np.sqrt(HIDDEN)).astype(dtype)))
        for rows in (int(r) for r in args.rows.split(",")):
            x = jnp.asarray(rng.standard_normal((rows, HIDDEN)).astype(dtype))
            compiled = {label: jax.jit(lambda x, layers, head, t=targets[dtype]: step(t, x, layers, head)).lower(
                x, layers, head).compile() for label, targets in builds.items()}
            outputs = {label: np.asarray(c(x, layers, head)).astype(np.float32) for label, c in compiled.items()}
            np.testing.assert_allclose(outputs["B"], outputs["A"], rtol=2e-2, atol=2e-2)
            times: dict[str, list[tuple[float, float]]] = {label: [] for label in compiled}
            for _ in range(args.rounds):
                for label, c in compiled.items():
                    run = functools.partial(c, x, layers, head)
                    times[label].append(seconds_of(lambda run=run: run().block_until_ready(), args.repeats))
            wall = {label: statistics.median(t[0] for t in values) for label, values in times.items()}
            cpu = {label: statistics.median(t[1] for t in values) for label, values in times.items()}
            print(f"| {dtype} | {rows} | {wall['A'] * 1e3:.1f} | {wall['B'] * 1e3:.1f} | {wall['A'] / wall['B']:.3f} | "
                  f"{cpu['A'] / cpu['B']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
