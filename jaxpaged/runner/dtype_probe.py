"""Which weight dtype is faster on this CPU: the start-up probe behind `dtype="auto"` on the CPU.

CPUs differ: AVX512-BF16 or AMX make bfloat16 dots 2-4x faster than float32 on some, others emulate bfloat16 and run
it slower. The probe times what a step does with its weights, in both dtypes: a scan over stacked layer matrices
(sliced as the model slices them, bfloat16 as uint16 bits) at a decode-sized and a prefill-sized row count. Whole
steps also read half the KV bytes in bfloat16, so the probe's verdict is a lower bound on bfloat16's gain.
"""

import dataclasses
import functools
import logging
import statistics

import jax
import jax.numpy as jnp

from jaxpaged.models.layers import matmul
from jaxpaged.timing import call_seconds
from pallas_kernels.bfloat16_bits import from_bits, to_bits

logger = logging.getLogger(__name__)

PROBE_ROWS = (64, 512)
"""A decode step's rows (64 sequences) and a prefill chunk's."""
PROBE_LAYERS, PROBE_HIDDEN, PROBE_INTERMEDIATE = 4, 1024, 2816
BFLOAT16_MARGIN = 0.9
"""bfloat16 must take under this fraction of float32's time: float32 is exact, so a tie goes to it."""


@dataclasses.dataclass(frozen=True)
class DtypeProbe:
    """Median seconds of the probe's layer loops (all row counts together) per dtype, and the pick."""

    float32_seconds: float
    bfloat16_seconds: float

    @property
    def choice(self) -> jnp.dtype:
        faster = self.bfloat16_seconds < BFLOAT16_MARGIN * self.float32_seconds
        return jnp.dtype(jnp.bfloat16 if faster else jnp.float32)


def _layer_loop(x: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """x through every stacked (up, down) pair with float32 sums, as the model's matmuls run."""

    def layer(x, weights):
        up, down = (from_bits(weight) for weight in weights)
        out = matmul(jax.nn.silu(matmul(x, up)), down)
        return x + out, None

    return jax.lax.scan(layer, x, (up, down))[0]


def _time_loop(dtype, rows: int, repeats: int = 5) -> float:
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    shape_up = (PROBE_LAYERS, PROBE_HIDDEN, PROBE_INTERMEDIATE)
    up = jax.random.normal(keys[0], shape_up, jnp.float32).astype(dtype) * 0.02
    down = jax.random.normal(keys[1], shape_up[:1] + shape_up[:0:-1], jnp.float32).astype(dtype) * 0.02
    up, down = to_bits(up), to_bits(down)  # stored as the model stores them (llama.DecoderLayers)
    x = jax.random.normal(keys[2], (rows, PROBE_HIDDEN), jnp.float32).astype(dtype)
    run = jax.jit(_layer_loop).lower(x, up, down).compile()
    return statistics.median(call_seconds(lambda: run(x, up, down).block_until_ready(), repeats))


@functools.cache
def probe_cpu_dtype() -> DtypeProbe:
    """Time the layer loop in float32 and bfloat16 (once per process; a few seconds, compiles included)."""
    float32 = sum(_time_loop(jnp.float32, rows) for rows in PROBE_ROWS)
    bfloat16 = sum(_time_loop(jnp.bfloat16, rows) for rows in PROBE_ROWS)
    probe = DtypeProbe(float32, bfloat16)
    logger.info("dtype auto on this CPU: %s (weight matmuls at %s rows took %.1f ms in bfloat16, %.1f ms in float32)",
                probe.choice.name, " and ".join(map(str, PROBE_ROWS)), bfloat16 * 1e3, float32 * 1e3)
    return probe
