"""Which matmul weight-only int8 projections run on this CPU: measured at start-up, as dtype="auto" is (dtype_probe).

CPU flags do not say it. XLA:CPU's int8 x int8 dot (behind the "int16 digits" matmul, int16_activations.py) is fast
on AMX tiles (Sapphire Rapids: int8 weights at 1.8x float32's output tok/s) and slow on Zen 4's VNNI (0.75x there);
the native int8 panels (packed_matmul.py) widen the weights to float32 and win where memory bandwidth is short; the
"bf16 panels" (int8_bf16_matmul.py) widen them to bfloat16 for AVX512-BF16's pair dot, twice float32's multiply-adds
per instruction, with the inputs rounded to bfloat16; XLA's dot with the int8 convert fused into its operand is the
fallback. So the plan times each of them against the float matmul the plan would otherwise run (the plan's dtype,
packed where the plan packs), on the loaded model's own projection shapes at a decode step's rows and a prefill
chunk's, and keeps the fastest. The verdict is kept per CPU
and per shape set (probe_cache.py), so each model measures once per machine.

When even the fastest int8 matmul is slower than the float one, the projections still stay int8: whoever asked for
int8 gets its memory (a quarter of float32's projection bytes) and its numerics, as vLLM and HF keep a requested
quantization on hardware without a fast kernel for it. The plan says so in a warning naming the ratio, so the slower
steps are never silent: dropping `quantization` is the user's call.
"""

import dataclasses
import functools
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.config import EngineConfig
from jaxpaged.kernels.cpu_native import int8_bf16_matmul, packed_matmul, vnni_matmul
from jaxpaged.kernels.cpu_native.int8_bf16_matmul import int8_bf16_available, pack_int8_pairs, packs_for_int8_bf16
from jaxpaged.kernels.cpu_native.native_build import source_digest
from jaxpaged.kernels.cpu_native.packed_matmul import (
    fills_whole_panels,
    pack_panels,
    packed_int8_available,
    packs_dtype,
)
from jaxpaged.kernels.cpu_native.vnni_matmul import pack_vnni, packs_for_vnni, vnni_available
from jaxpaged.models.int8_activations import VnniW8A8Weight, W8A8Weight
from jaxpaged.models.int8_bf16_weights import Int8Bf16Weight
from jaxpaged.models.int8_weights import QUANTIZED_PROJECTIONS, Int8Weight
from jaxpaged.models.int16_activations import VnniW8A16Weight, W8A16Weight, cpu_has_int8_dot_units
from jaxpaged.models.layers import matmuls
from jaxpaged.runner.buckets import token_ladder
from jaxpaged.runner.probe_cache import keep_verdict, read_verdict, verdict_file
from jaxpaged.runner.zero_padded import HostWeight

logger = logging.getLogger(__name__)

FLOAT = "float"
"""The baseline's name in a probe's table: the float matmul the plan runs without quantization."""
WEIGHT_ONLY_CANDIDATES = ("int16 digits", "panels", "xla", "vnni digits", "bf16 panels")
"""Weight-only int8's matmuls, in the order a tie goes (the fourth: int16 digits on the native VNNI matmul; the
fifth: int8 panels widened to bfloat16 against inputs rounded to bfloat16, on AVX512-BF16's pair dot)."""
CANDIDATES = (*WEIGHT_ONLY_CANDIDATES, "w8a8", "vnni w8a8")
"""The int8 matmuls a CPU rank can run (StartupPlan.int8_matmul), in the order a tie goes: weight-only int8's, then
w8a8's (the same product on XLA's int8 dot or the native VNNI matmul)."""
PROJECTION_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
"""The projections that share one input in a decoder layer (one fused matmuls call each, as llama.py runs them)."""
PROBE_LAYERS = 2
"""Layers of distinct weights per timed call, so no call finds its weights in cache from the call before."""
PREFILL_ROWS_CAP = 256
"""A prefill chunk's rows at most: keeps the probe a few seconds at large max_num_batched_tokens."""
REPEATS = 3


@dataclasses.dataclass(frozen=True)
class ProbeShapes:
    """What the probe times: the model's projections and the step's rows, in the plan's dtype and packing."""

    projections: tuple[tuple[str, int, int], ...]
    """(name, inner, outer) of each quantized projection of one decoder layer."""
    rows: tuple[int, ...]
    """A decode step's rows and a prefill chunk's (bucket sizes)."""
    dtype: str
    """The plan's dtype: the float baseline's weights and every path's activations."""
    packed_float: bool
    """The plan packs float weights for the native matmul (the baseline runs it)."""
    candidates: tuple[str, ...] = ()
    """The int8 matmuls this rank can run (choose_int8_matmul fills them in)."""

    def key(self) -> tuple[str, ...]:
        """The verdict's cache key parts (beside the CPU and JAX)."""
        sources = (packed_matmul.SOURCE, vnni_matmul.SOURCE, int8_bf16_matmul.SOURCE)  # every kernel it may time
        return (repr(dataclasses.astuple(self)), repr((PROBE_LAYERS, PREFILL_ROWS_CAP)), source_digest(*sources))


@dataclasses.dataclass(frozen=True)
class Int8Probe:
    """Median seconds of each path (FLOAT and the candidates timed) at each of `rows`, and the pick."""

    rows: tuple[int, ...]
    seconds: dict[str, tuple[float, ...]]

    def relative_time(self, path: str) -> float:
        """`path`'s time over the float matmul's: the geometric mean over the row counts (decode and prefill count
        alike); under 1 is faster than float."""
        ratios = [mine / base for mine, base in zip(self.seconds[path], self.seconds[FLOAT])]
        return math.exp(statistics.fmean(math.log(ratio) for ratio in ratios))

    @property
    def choice(self) -> str:
        """The fastest int8 matmul timed."""
        return min((path for path in CANDIDATES if path in self.seconds), key=self.relative_time)

    @property
    def beats_float(self) -> bool:
        """Whether the chosen int8 matmul is faster than the float one."""
        return self.relative_time(self.choice) < 1.0

    def describe(self, dtype: str, source: str) -> str:
        """One line naming the pick and every path's speed as a multiple of the float matmul's."""
        others = ", ".join(f"{path} {self._speed(path)}" for path in CANDIDATES
                           if path in self.seconds and path != self.choice)
        timed = f"{PROBE_LAYERS} layers' projections at {' and '.join(map(str, self.rows))} rows; {source}"
        figures = f"{self._speed(self.choice)} {dtype}'s matmul speed ({others + '; ' if others else ''}{timed})"
        if self.beats_float:
            return f"int8 projections on this CPU: {self.choice}, {figures}"
        scheme = "w8a8" if self.choice in ("w8a8", "vnni w8a8") else "int8"
        return (f"quantization {scheme} on this CPU saves memory, not time: its fastest matmul ({self.choice}) runs at "
                f"{figures}; the projections stay int8 for their memory (1 byte a weight, {dtype}'s "
                f"{jnp.dtype(dtype).itemsize}); leave quantization unset if speed matters more than memory")

    def _speed(self, path: str) -> str:
        return f"{1 / self.relative_time(path):.2f}x"


def probe_shapes(params: Mapping[str, HostWeight], config: EngineConfig, dtype: Any, packed_float: bool) -> ProbeShapes:
    """The probe's shapes for a rank of this model and config: each int8 layer projection's [inner, outer] (the
    whole weight: a tensor-parallel rank's share is smaller), a decode step's bucket (max_num_seqs rows) and the
    largest prefill bucket (at most PREFILL_ROWS_CAP rows)."""
    projections = tuple((name, int(value.shape[-2]), int(value.shape[-1])) for name in QUANTIZED_PROJECTIONS
                        if (value := params.get(f"layers.{name}")) is not None and value.dtype == np.int8)
    scheduler = config.scheduler
    ladder = token_ladder(scheduler.max_num_batched_tokens)
    decode = next(size for size in ladder if size >= scheduler.max_num_seqs)
    prefill = min(ladder[-1], max(PREFILL_ROWS_CAP, decode))
    return ProbeShapes(projections, tuple(sorted({decode, prefill})), jnp.dtype(dtype).name, packed_float)


def int8_candidates(per_layer: bool, tp: int, scheme: str = "int8") -> tuple[str, ...]:
    """The int8 matmuls a CPU rank can run for `scheme`: weight-only int8 XLA's two always, the native panels on one
    device with layers unrolled where the kernel builds, and there the digits on the VNNI matmul where this CPU has
    VPDPBUSD and the bfloat16-dot panels where it has AVX512-BF16; w8a8 XLA's int8 dot always, and there the native
    VNNI matmul where this CPU has VPDPBUSD."""
    native = per_layer and tp == 1
    if scheme == "w8a8":
        return ("w8a8", "vnni w8a8") if native and vnni_available() else ("w8a8",)
    runs = {"panels": native and packed_int8_available(), "vnni digits": native and vnni_available(),
            "bf16 panels": native and int8_bf16_available()}
    return tuple(path for path in WEIGHT_ONLY_CANDIDATES if runs.get(path, True))


def choose_int8_matmul(scheme: Optional[str], platform: str, per_layer: bool, tp: int, native_cpu_matmul: bool,
                       shapes: Optional[ProbeShapes] = None) -> Optional[str]:
    """The int8 projections' matmul (StartupPlan.int8_matmul) for a scheme on a rank. w8a8: XLA's int8 dot, or on a
    CPU rank that can run the native VNNI matmul whichever of the two times faster on `shapes`. Weight-only int8:
    off the CPU, or with cpu_matmul "xla" (`native_cpu_matmul` False), XLA's fused-convert dot. On a CPU, the
    fastest of the candidates on `shapes` (probe_int8_matmul); without shapes, or with several processes (each must
    build the same step, and their timings could disagree), the flags' guess: int16 digits where the CPU has int8
    dot units (VNNI, AMX), else the panels where they run, else XLA's dot."""
    if scheme is None:
        return scheme
    measurable = shapes is not None and shapes.projections and jax.process_count() == 1
    if scheme == "w8a8":
        candidates = int8_candidates(per_layer, tp, scheme) if platform == "cpu" and native_cpu_matmul else ()
        if len(candidates) < 2 or not measurable:
            return "w8a8"
        assert shapes is not None
        return probe_int8_matmul(dataclasses.replace(shapes, candidates=candidates)).choice
    if platform != "cpu" or not native_cpu_matmul:
        return "xla"
    if measurable:
        assert shapes is not None
        return probe_int8_matmul(dataclasses.replace(shapes, candidates=int8_candidates(per_layer, tp))).choice
    if cpu_has_int8_dot_units():
        return "int16 digits"
    return "panels" if "panels" in int8_candidates(per_layer, tp) else "xla"


@functools.cache
def probe_int8_matmul(shapes: ProbeShapes) -> Int8Probe:
    """Time the float matmul and each candidate on `shapes`: once per machine and shape set (a few seconds,
    compiles included), then the verdict kept under the cache directory answers (delete it to measure again).
    Logs the verdict in one line: a warning when no int8 matmul beats the float one."""
    path = verdict_file("int8_probe", *shapes.key())
    probe = _read_probe(read_verdict(path), shapes)
    source = f"kept in {path}"
    if probe is None:
        paths = (FLOAT, *shapes.candidates)
        by_rows = [_time_paths(paths, shapes, rows) for rows in shapes.rows]
        seconds = {name: tuple(times[index] for times in by_rows) for index, name in enumerate(paths)}
        probe = Int8Probe(shapes.rows, seconds)
        keep_verdict(path, {"rows": list(probe.rows), "seconds": {k: list(v) for k, v in seconds.items()}})
        source = "measured now"
    line = probe.describe(shapes.dtype, source)
    logger.log(logging.INFO if probe.beats_float else logging.WARNING, "%s", line)
    return probe


def _read_probe(kept: Any, shapes: ProbeShapes) -> Optional[Int8Probe]:
    """The kept verdict, or None unless it holds a positive time for every path at every row count of `shapes`."""
    try:
        rows = tuple(int(size) for size in kept["rows"])
        seconds = {name: tuple(float(value) for value in kept["seconds"][name])
                   for name in (FLOAT, *shapes.candidates)}
    except (KeyError, TypeError, ValueError):
        return None
    valid = all(len(times) == len(rows) and all(math.isfinite(t) and t > 0 for t in times)
                for times in seconds.values())
    return Int8Probe(rows, seconds) if valid and rows == shapes.rows else None


def _weight(path: str, values: np.ndarray, shapes: ProbeShapes) -> Any:
    """One projection in `path`'s form, as the engine would place it (llama._projection)."""
    scale = jnp.full(values.shape[1], 0.01, jnp.float32)
    if path == FLOAT:
        dense = (values.astype(np.float32) * 0.01).astype(shapes.dtype)
        # packs_dtype registers the kernel (the plan asked for it already; a test may not have).
        packs = shapes.packed_float and packs_dtype(dense.dtype) and fills_whole_panels(values.shape, dense.dtype)
        return jnp.asarray(pack_panels(dense) if packs else dense)
    if path == "vnni digits" and packs_for_vnni(values.shape):
        return VnniW8A16Weight(jnp.asarray(pack_vnni(values)), scale)
    if path in ("int16 digits", "vnni digits"):
        return W8A16Weight(jnp.asarray(values), scale)
    if path == "bf16 panels" and packs_for_int8_bf16(values.shape) and values.shape[0] % 2 == 0:
        return Int8Bf16Weight(jnp.asarray(pack_int8_pairs(values)), scale)
    if path == "vnni w8a8" and packs_for_vnni(values.shape):
        return VnniW8A8Weight(jnp.asarray(pack_vnni(values)), scale)
    if path in ("w8a8", "vnni w8a8"):
        return W8A8Weight(jnp.asarray(values), scale)
    packs = path == "panels" and fills_whole_panels(values.shape, np.int8)
    return Int8Weight(jnp.asarray(pack_panels(values) if packs else values), scale)


def _compiled(path: str, shapes: ProbeShapes, rows: int) -> Callable[[], object]:
    """PROBE_LAYERS layers' projections in `path`'s form at `rows` rows, compiled: a call that returns once done."""
    random = np.random.default_rng(0)
    sizes = {name: (inner, outer) for name, inner, outer in shapes.projections}
    groups = [[name for name in group if name in sizes] for group in PROJECTION_GROUPS]
    groups = [group for group in groups if group]
    layers, inputs = [], []
    for _ in range(PROBE_LAYERS):
        layers.append([[_weight(path, random.integers(-127, 128, sizes[name], np.int8), shapes) for name in group]
                       for group in groups])
        inputs.append([jnp.asarray(random.standard_normal((rows, sizes[group[0]][0]), np.float32), shapes.dtype)
                       for group in groups])

    def projections(inputs, layers):
        return [matmuls(x, weights) for layer_inputs, layer in zip(inputs, layers)
                for x, weights in zip(layer_inputs, layer)]

    run = jax.jit(projections).lower(inputs, layers).compile()
    return lambda: jax.block_until_ready(run(inputs, layers))


def _time_paths(paths: tuple[str, ...], shapes: ProbeShapes, rows: int) -> list[float]:
    """Median seconds of each path at `rows` rows, after one untimed call each (as timing.call_seconds). The paths
    take turns, repeat by repeat, so a change in the machine's load meets all of them alike."""
    runs = [_compiled(path, shapes, rows) for path in paths]
    for run in runs:
        run()
    rounds = []
    for _ in range(REPEATS):
        turn = []
        for run in runs:
            start = time.perf_counter()
            run()
            turn.append(time.perf_counter() - start)
        rounds.append(turn)
    return [statistics.median(times) for times in zip(*rounds)]
