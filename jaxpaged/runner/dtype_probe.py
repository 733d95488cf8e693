"""Which weight dtype is faster on this CPU: the start-up probe behind `dtype="auto"` on the CPU.

CPUs differ: AVX512-BF16 or AMX make bfloat16 dots 2-4x faster than float32 on some, others emulate bfloat16 and run
it slower. The probe times what a CPU step does with its weights, in both dtypes: unrolled layers, each matmul
reading its own weight array (as llama.DecoderLayers stores them on the CPU; packed for the native matmul in each
dtype it is built for, as packed_weights.py stores them), at a decode-sized and a prefill-sized row count. Whole
steps also read half the KV bytes in bfloat16, so the probe's verdict is a lower bound on bfloat16's gain.
"""

import dataclasses
import functools
import logging
import pathlib
import statistics
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.kernels.cpu_native import packed_matmul
from jaxpaged.kernels.cpu_native.native_build import source_digest
from jaxpaged.models.layers import matmul
from jaxpaged.models.packed_weights import packs_weights_on
from jaxpaged.runner.probe_cache import keep_verdict, read_verdict, verdict_file
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


def _packs(dtype, native_matmul: bool) -> bool:
    """Whether steps in `dtype` on this CPU (one device per rank, as every CPU rank is unless tensor parallel) run the
    native packed matmul (models/packed_weights.py; `native_matmul`: the config's cpu_matmul allows it), as the probe
    then does too. Builds the kernel if needed."""
    return native_matmul and packs_weights_on("cpu", dtype, 1)


def _time_loop(dtype, rows: int, native_matmul: bool, repeats: int = 5) -> float:
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * PROBE_LAYERS + 1)
    packed = _packs(dtype, native_matmul)

    def weight(key, shape):
        value = (jax.random.normal(key, shape, jnp.float32) * 0.02).astype(dtype)
        return jnp.asarray(packed_matmul.pack_panels(np.asarray(value))) if packed else value

    ups = [weight(key, (PROBE_HIDDEN, PROBE_INTERMEDIATE)) for key in keys[:PROBE_LAYERS]]
    downs = [weight(key, (PROBE_INTERMEDIATE, PROBE_HIDDEN)) for key in keys[PROBE_LAYERS:-1]]
    x = jax.random.normal(keys[-1], (rows, PROBE_HIDDEN), jnp.float32).astype(dtype)
    run = jax.jit(_layer_loop).lower(x, ups, downs).compile()
    return statistics.median(call_seconds(lambda: run(x, ups, downs).block_until_ready(), repeats))


def verdict_path(native_matmul: bool = True) -> pathlib.Path:
    """Where this machine keeps its verdict: keyed by the CPU (model and every flag), JAX, the probe's shapes and each
    dtype's matmul path (the packed kernel's source and headers, when it is built: this builds it)."""
    shapes = (PROBE_ROWS, PROBE_LAYERS, PROBE_HIDDEN, PROBE_INTERMEDIATE)
    source = source_digest(packed_matmul.SOURCE)
    paths = [source if _packs(dtype, native_matmul) else "xla" for dtype in (jnp.float32, jnp.bfloat16)]
    return verdict_file("dtype_probe", repr(shapes), *paths)


def _read_verdict(path: pathlib.Path) -> Optional[DtypeProbe]:
    """The kept verdict, or None when there is none or it does not read as two positive times."""
    kept = read_verdict(path)
    try:
        probe = DtypeProbe(float(kept["float32_seconds"]), float(kept["bfloat16_seconds"]))
    except (ValueError, KeyError, TypeError):
        return None
    return probe if probe.float32_seconds > 0 and probe.bfloat16_seconds > 0 else None


@functools.cache
def probe_cpu_dtype(native_matmul: bool = True) -> DtypeProbe:
    """Time the layer loop in float32 and bfloat16, with the matmuls the engine will run (`native_matmul`: the
    packed kernel where it builds, else XLA's dot): once per machine, a few seconds, compiles included; then the
    verdict kept under the cache directory answers (delete it to measure again)."""
    path = verdict_path(native_matmul)
    probe = _read_verdict(path)
    source = f"kept in {path}"
    if probe is None:
        probe = DtypeProbe(sum(_time_loop(jnp.float32, rows, native_matmul) for rows in PROBE_ROWS),
                           sum(_time_loop(jnp.bfloat16, rows, native_matmul) for rows in PROBE_ROWS))
        keep_verdict(path, dataclasses.asdict(probe))
        source = "measured now"
    logger.info("dtype auto on this CPU: %s (weight matmuls at %s rows took %.1f ms in bfloat16, %.1f ms in "
                "float32; %s)", probe.choice.name, " and ".join(map(str, PROBE_ROWS)), probe.bfloat16_seconds * 1e3,
                probe.float32_seconds * 1e3, source)
    return probe
