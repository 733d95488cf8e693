"""Which weight dtype is faster on this CPU: the start-up probe behind `dtype="auto"` on the CPU.

CPUs differ: AVX512-BF16 or AMX make bfloat16 dots 2-4x faster than float32 on some, others emulate bfloat16 and run
it slower. The probe times what a CPU step does with its weights, in both dtypes: unrolled layers, each matmul
reading its own weight array (as llama.DecoderLayers stores them on the CPU), at a decode-sized and a prefill-sized
row count. Whole steps also read half the KV bytes in bfloat16, so the probe's verdict is a lower bound on
bfloat16's gain.
"""

import dataclasses
import functools
import logging
import statistics

import jax
import jax.numpy as jnp

from jaxpaged.models.layers import matmul
from jaxpaged.timing import call_seconds

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


def _layer_loop(x: jax.Array, ups: list[jax.Array], downs: list[jax.Array]) -> jax.Array:
    """x through every (up, down) pair with float32 sums, as the model's matmuls run."""
    for up, down in zip(ups, downs):
        x = x + matmul(jax.nn.silu(matmul(x, up)), down)
    return x


def _time_loop(dtype, rows: int, repeats: int = 5) -> float:
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * PROBE_LAYERS + 1)

    def weight(key, shape):
        return (jax.random.normal(key, shape, jnp.float32) * 0.02).astype(dtype)

    ups = [weight(key, (PROBE_HIDDEN, PROBE_INTERMEDIATE)) for key in keys[:PROBE_LAYERS]]
    downs = [weight(key, (PROBE_INTERMEDIATE, PROBE_HIDDEN)) for key in keys[PROBE_LAYERS:-1]]
    x = jax.random.normal(keys[-1], (rows, PROBE_HIDDEN), jnp.float32).astype(dtype)
    run = jax.jit(_layer_loop).lower(x, ups, downs).compile()
    return statistics.median(call_seconds(lambda: run(x, ups, downs).block_until_ready(), repeats))


@functools.cache
def probe_cpu_dtype() -> DtypeProbe:
    """Time the layer loop in float32 and bfloat16 (once per process; a few seconds, compiles included)."""
    float32 = sum(_time_loop(jnp.float32, rows) for rows in PROBE_ROWS)
    bfloat16 = sum(_time_loop(jnp.bfloat16, rows) for rows in PROBE_ROWS)
    probe = DtypeProbe(float32, bfloat16)
    logger.info("dtype auto on this CPU: %s (weight matmuls at %s rows took %.1f ms in bfloat16, %.1f ms in float32)",
                probe.choice.name, " and ".join(map(str, PROBE_ROWS)), bfloat16 * 1e3, float32 * 1e3)
    return probe
