"""The grouped matmul's `make tpu-compile` cases: real MoE expert projections at a decode and a prefill batch.

Each case compiles pallas_kernels/grouped_matmul's kernel through libtpu for one chip of a v5e / v6e topology (one
chip holds every expert: the shapes are what one device of an expert-parallel mesh sees times its share of the
experts) and reads XLA:TPU's memory plan: HBM arguments (the expert weights dominate) and temporaries, which must stay
small: `weights_copied` says when XLA:TPU copies the weight tensor per call (which reads every expert at decode).

It does when n is not a multiple of 128 (gpt-oss's down projection, [128, 2880, 2880]): XLA then gives the weight
parameter a permuted HBM layout ({0,2,1}, the 128 experts minor, to avoid padding 2880 lanes) and relayouts it for the
Mosaic call, megablox's kernel and ours alike. Weights padded to whole 128-lane columns once at load ("padded" rows:
[128, 2880, 2944], zero columns, the output's extra columns sliced off by the caller) keep the row-major layout and
compile with no copy.
"""

import dataclasses
import time

import jax
import jax.numpy as jnp

from pallas_kernels.grouped_matmul.tpu import grouped_matmul_tpu
from pallas_kernels.grouped_matmul.tpu_schedule import max_visits
from pallas_kernels.grouped_matmul.tpu_tiles import choose_tiles, vmem_bytes

MIB = 1024 * 1024
DECODE_TOKENS = 64
PREFILL_TOKENS = 512
GMM_COLUMNS = ("model", "projection", "chip", "batch", "rows", "weights", "result", "tiles", "grid", "vmem",
               "hbm_args", "hbm_temp", "weights_copied", "seconds")
LANES = 128


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """One MoE family's expert projections: weights [num_experts, in, out]."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int

    def projections(self) -> tuple[tuple[str, int, int], ...]:
        """(name, k, n) of the fused gate_up and the down projection."""
        return ("gate_up", self.hidden, 2 * self.intermediate), ("down", self.intermediate, self.hidden)


MOE_SHAPES = (
    MoeShape("Qwen3-30B-A3B", 128, 8, 2048, 768),
    MoeShape("gpt-oss-120b", 128, 4, 2880, 2880),
)


@dataclasses.dataclass(frozen=True)
class GmmCase:
    """One projection at one batch, compiled for one chip, with float or int8 (weight-only) experts."""

    shape: MoeShape
    projection: str
    k: int
    n: int
    chip: str
    tokens: int
    weights: str
    padded: bool = False
    """The weights' n padded to whole 128-lane columns at load (the kernel sees n rounded up)."""

    @property
    def rows(self) -> int:
        return self.tokens * self.shape.top_k

    @property
    def weight_columns(self) -> int:
        return -(-self.n // LANES) * LANES if self.padded else self.n


def gmm_cases(chips, shapes=None, full: bool = False) -> list[GmmCase]:
    """Both projections of every shape at decode and prefill batches in bfloat16; an n that is not a multiple of
    128 as is (decode) and padded at load (both batches). `full` adds int8 experts everywhere, the default at one
    case (the padded gpt-oss down projection at decode)."""
    cases = []
    for shape in MOE_SHAPES:
        if shapes and shape.name not in shapes:
            continue
        for chip in chips:
            for projection, k, n in shape.projections():
                for tokens in (DECODE_TOKENS, PREFILL_TOKENS):
                    for padded in ((False, True) if n % LANES else (False,)):
                        for weights in ("bfloat16", "int8"):
                            as_is_prefill = n % LANES and not padded and tokens == PREFILL_TOKENS
                            if not full and (as_is_prefill or (weights == "int8" and not (
                                    padded and tokens == DECODE_TOKENS))):
                                continue
                            cases.append(GmmCase(shape, projection, k, n, chip, tokens, weights, padded))
    return cases


def compile_gmm_case(case: GmmCase, device, message) -> dict:
    """Compile one case for `device` (a topology's TPU device); the table row. `message` words a rejection."""
    n = case.weight_columns
    row = dict(model=case.shape.name, projection=f"{case.projection} [{case.shape.num_experts},{case.k},{n}]",
               chip=case.chip, batch=f"{'decode' if case.tokens == DECODE_TOKENS else 'prefill'} {case.tokens}",
               rows=case.rows, weights=case.weights + (" padded" if case.padded else ""))
    tiles = choose_tiles(case.rows, case.k, n, case.shape.num_experts, case.weights)
    visits = max_visits(-(-case.rows // tiles.row_tile), case.shape.num_experts)
    row |= dict(tiles=f"{tiles.row_tile}x{tiles.contraction_tile}x{tiles.column_tile}",
                grid=f"{-(-n // tiles.column_tile)}x{visits}x{-(-case.k // tiles.contraction_tile)}",
                vmem=f"{vmem_bytes(tiles, jnp.bfloat16, case.weights) / MIB:.1f}M")
    started = time.perf_counter()
    sharding = jax.sharding.SingleDeviceSharding(device)
    shapes = [((case.rows, case.k), jnp.bfloat16), ((case.shape.num_experts, case.k, n), case.weights),
              ((case.shape.num_experts,), jnp.int32)]
    if case.weights == "int8":
        shapes.append(((case.shape.num_experts, n), jnp.float32))
    weight_bytes = case.shape.num_experts * case.k * n * jnp.dtype(case.weights).itemsize
    abstract = [jax.ShapeDtypeStruct(dims, dtype, sharding=sharding) for dims, dtype in shapes]
    with jax.default_device(device):
        try:
            stats = jax.jit(grouped_matmul_tpu).lower(*abstract).compile().memory_analysis()
            assert stats is not None, "XLA:TPU plans memory for every executable"
            row |= dict(result="OK", hbm_args=f"{stats.argument_size_in_bytes / MIB:.1f}M",
                        hbm_temp=f"{stats.temp_size_in_bytes / MIB:.2f}M",
                        weights_copied="yes" if stats.temp_size_in_bytes >= weight_bytes // 2 else "no")
        except Exception as error:  # noqa: BLE001 - the compiler's rejection is the row's result
            row |= dict(result=message(error), hbm_args="-", hbm_temp="-", weights_copied="-")
    row["seconds"] = f"{time.perf_counter() - started:.1f}"
    return row
