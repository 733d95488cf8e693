"""Grouped matmul through Pallas' Triton lowering (GPU): one program per (column tile, visit) of the TPU schedule.

The visits are tpu_schedule.py's (row tile, non-empty group) pairs, padded to a static count; a program whose visit
multiplies no group exits at once, so an empty group's weights are never read and a decode reads each touched
group's once per row tile it spans (its few rows usually sit in one). A program walks k in `contraction_tile`
steps, float32 accumulation, and stores only its group's rows of its tile, so the programs sharing a row tile
write disjoint rows and need no ordering. Rows past sum(group_sizes) are zeroed after the call.

On the GPU memory is linear: rhs is read as a [groups * k, n] matrix (a free reshape), a group's rows offset by
group * k. Triton wants power-of-two tile sides (>= 16 for tl.dot): k and n tails are masked loads (indices clamped
in bounds, masked to zero) and masked stores. int8 weights are converted to the lhs dtype in registers and the
group's column scales applied to the accumulator. float32 asks for Precision.HIGHEST (IEEE dots, not TF32).
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int8, Int32

from pallas_kernels.grouped_matmul.reference import check_grouped_matmul_args
from pallas_kernels.grouped_matmul.tpu_schedule import HAS_GROUP, max_visits, visit_schedule
from pallas_kernels.grouped_matmul.tpu_tiles import GroupedMatmulTiles

DEFAULT_TILES = GroupedMatmulTiles(row_tile=16, contraction_tile=64, column_tile=128)


def _kernel(group_ids_ref, row_tiles_ref, flags_ref, group_offsets_ref, lhs_ref, rhs_ref, *rest,
            k: int, n: int, tiles: GroupedMatmulTiles, has_scale: bool):
    scale_ref, out_ref = rest if has_scale else (None, *rest)
    tm, tk, tn = tiles.row_tile, tiles.contraction_tile, tiles.column_tile
    column_tile, visit = pl.program_id(0), pl.program_id(1)

    @pl.when((flags_ref[visit] & HAS_GROUP) != 0)
    def _multiply_group():
        group = group_ids_ref[visit]
        rows = row_tiles_ref[visit] * tm + jnp.arange(tm, dtype=jnp.int32)
        columns = column_tile * tn + jnp.arange(tn, dtype=jnp.int32)
        column_is_real = columns < n
        columns_in_bounds = jnp.minimum(columns, n - 1)
        precision = jax.lax.Precision.HIGHEST if lhs_ref.dtype == jnp.float32 else None

        def accumulate(k_tile, acc):
            ks = k_tile * tk + jnp.arange(tk, dtype=jnp.int32)
            k_is_real = ks < k
            ks_in_bounds = jnp.minimum(ks, k - 1)
            lhs = plgpu.load(lhs_ref.at[rows[:, None], ks_in_bounds[None, :]], mask=k_is_real[None, :], other=0)
            rhs = plgpu.load(rhs_ref.at[group * k + ks_in_bounds[:, None], columns_in_bounds[None, :]],
                             mask=k_is_real[:, None] & column_is_real[None, :], other=0)
            return acc + jax.lax.dot(lhs, rhs.astype(lhs.dtype), precision=precision,
                                     preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, pl.cdiv(k, tk), accumulate, jnp.zeros((tm, tn), jnp.float32))
        if scale_ref is not None:
            acc = acc * plgpu.load(scale_ref.at[group, columns_in_bounds], mask=column_is_real, other=0)[None, :]
        in_group = (rows >= group_offsets_ref[group]) & (rows < group_offsets_ref[group + 1])
        # Stores take the unclamped columns: clamped ones would repeat column n - 1 (its masked copies could win).
        plgpu.store(out_ref.at[rows[:, None], columns[None, :]], acc.astype(out_ref.dtype),
                    mask=in_group[:, None] & column_is_real[None, :])


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


@functools.partial(jax.jit, static_argnames=("tiles", "num_warps", "num_stages", "interpret"))
def grouped_matmul_gpu(
    lhs: Float[Array, "m k"],
    rhs: Float[Array, "groups k n"] | Int8[Array, "groups k n"],
    group_sizes: Int32[Array, " groups"],
    rhs_scale: Optional[Float[Array, "groups n"]] = None,
    *,
    tiles: GroupedMatmulTiles = DEFAULT_TILES,
    num_warps: int = 4,
    num_stages: int = 3,
    interpret: bool = False,
) -> Float[Array, "m n"]:
    """The grouped-matmul contract (reference.py) on a GPU; interpret=True runs the kernel as plain jnp on the CPU.

    tiles: power-of-two sides, rows and columns at least 16 (tl.dot's operands).
    """
    check_grouped_matmul_args(lhs, rhs, group_sizes, rhs_scale)
    (m, k), (num_groups, _, n) = lhs.shape, rhs.shape
    if m == 0:  # no rows, no tiles: nothing to launch
        return jnp.zeros((0, n), lhs.dtype)
    tm, tk, tn = tiles.row_tile, tiles.contraction_tile, tiles.column_tile
    if not all(_is_power_of_two(side) and side >= 16 for side in (tm, tk, tn)):
        raise ValueError(f"tiles: every side must be a power of two of at least 16, got {tiles}")
    num_row_tiles = -(-m // tm)
    schedule = visit_schedule(group_sizes, m, num_row_tiles, tm)
    operands = [jnp.pad(lhs, ((0, num_row_tiles * tm - m), (0, 0))), rhs.reshape(num_groups * k, n)]
    if rhs_scale is not None:
        operands.append(rhs_scale)
    out = pl.pallas_call(
        functools.partial(_kernel, k=k, n=n, tiles=tiles, has_scale=rhs_scale is not None),
        grid=(-(-n // tn), max_visits(num_row_tiles, num_groups)),
        out_shape=jax.ShapeDtypeStruct((num_row_tiles * tm, n), lhs.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="grouped_matmul_gpu",
    )(*schedule.arrays(), *operands)
    # Rows past sum(group_sizes) belong to no visit and were never written (uninitialised memory): zero them.
    num_real_rows = jnp.minimum(jnp.sum(jnp.maximum(group_sizes, 0)), m)
    return jnp.where((jnp.arange(m) < num_real_rows)[:, None], out[:m], 0).astype(lhs.dtype)
