"""Grouped matmul on TPU (Mosaic): rows tiled per group, only non-empty groups' weight blocks fetched.

Our own kernel rather than JAX's megablox `gmm`. libtpu compiles megablox at the MoE shapes, but it takes no int8
weights or per-column scales (int8 experts would be converted, i.e. every expert read and written, per call), leaves
the rows past sum(group_sizes) unwritten, and tiles k, n and rows alike (128 each by default, each row tile re-fetching
its group's weights per k tile). Both kernels get a per-call copy of the whole weight tensor from XLA:TPU when n is not
a multiple of 128 (gpt-oss's [128, 2880, 2880]: 2 GiB of temporaries); weight_layout.py pads n at load instead.
The compile evidence is in docs/tpu-compile.md ("The MoE grouped matmul").

Grid: (column tile, visit, contraction tile). A visit is one (row tile, group) pair from tpu_schedule.py, in row
order; its weight block index (group, k tile, column tile) comes from the scalar-prefetched schedule, so the
pipeline fetches the next group's weights while this one multiplies, and visits that name the same block as the
step before (idle visits, padding tiles, a group spanning row tiles with k in one block) fetch nothing. The output
block is zeroed by its tile's first visit; each group's visit writes only its own rows (a row mask), so several
groups share a tile and rows past the last group stay zero. Accumulation is float32 in VMEM scratch; int8 weights
are converted to the lhs dtype (exact) before the MXU and the group's column scales applied to the accumulator.
"""

import functools
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float, Int8, Int32

from pallas_kernels.grouped_matmul.reference import check_grouped_matmul_args
from pallas_kernels.grouped_matmul.tpu_schedule import FIRST_OF_TILE, HAS_GROUP, max_visits, visit_schedule
from pallas_kernels.grouped_matmul.tpu_tiles import GroupedMatmulTiles, choose_tiles, vmem_bytes
from pallas_kernels.ragged_paged_attention.tpu_vmem import default_vmem_limit_bytes


def _kernel(group_ids_ref, row_tiles_ref, flags_ref, group_offsets_ref,  # scalar prefetch (SMEM)
            lhs_ref, rhs_ref, *rest, num_k_tiles: int, k_tail: int, has_scale: bool):
    scale_ref, out_ref, acc_ref = rest if has_scale else (None, *rest)
    visit, k_tile = pl.program_id(1), pl.program_id(2)
    flags = flags_ref[visit]

    @pl.when((k_tile == 0) & ((flags & FIRST_OF_TILE) != 0))
    def _zero_output_tile():
        out_ref[...] = jnp.zeros_like(out_ref)

    def multiply(mask_k_tail: bool):
        rhs = rhs_ref[...]
        if mask_k_tail:  # the weight block's rows past k are another tensor's bytes (or garbage): zero them
            rows = jax.lax.broadcasted_iota(jnp.int32, rhs.shape, 0)
            rhs = jnp.where(rows < k_tail, rhs, jnp.zeros_like(rhs))
        product = jnp.dot(lhs_ref[...], rhs.astype(lhs_ref.dtype), preferred_element_type=jnp.float32)
        acc_ref[...] = product if num_k_tiles == 1 else acc_ref[...] + product

    @pl.when((flags & HAS_GROUP) != 0)
    def _multiply_group():
        if num_k_tiles > 1:
            @pl.when(k_tile == 0)
            def _zero_accumulator():
                acc_ref[...] = jnp.zeros_like(acc_ref)

        if k_tail:
            pl.when(k_tile < num_k_tiles - 1)(lambda: multiply(False))
            pl.when(k_tile == num_k_tiles - 1)(lambda: multiply(True))
        else:
            multiply(False)

        @pl.when(k_tile == num_k_tiles - 1)
        def _store_group_rows():
            group = group_ids_ref[visit]
            tm, tn = out_ref.shape
            rows = jax.lax.broadcasted_iota(jnp.int32, (tm, tn), 0) + row_tiles_ref[visit] * tm
            in_group = (rows >= group_offsets_ref[group]) & (rows < group_offsets_ref[group + 1])
            result = acc_ref[...] * scale_ref[...] if scale_ref is not None else acc_ref[...]
            out_ref[...] = jnp.where(in_group, result.astype(out_ref.dtype), out_ref[...])


@functools.partial(jax.jit, static_argnames=("tiles", "interpret", "vmem_limit_bytes"))
def grouped_matmul_tpu(
    lhs: Float[Array, "m k"],
    rhs: Float[Array, "groups k n"] | Int8[Array, "groups k n"],
    group_sizes: Int32[Array, " groups"],
    rhs_scale: Optional[Float[Array, "groups n"]] = None,
    *,
    tiles: Optional[GroupedMatmulTiles] = None,
    interpret: Union[bool, pltpu.InterpretParams] = False,
    vmem_limit_bytes: Optional[int] = None,
) -> Float[Array, "m n"]:
    """The grouped-matmul contract (reference.py) on TPU; interpret=True simulates a TPU on CPU.

    tiles: None picks them (tpu_tiles.py); vmem_limit_bytes: None asks for most of the chip's VMEM.
    """
    check_grouped_matmul_args(lhs, rhs, group_sizes, rhs_scale)
    (m, k), (num_groups, _, n) = lhs.shape, rhs.shape
    if m == 0:  # no rows, no tiles: nothing to launch
        return jnp.zeros((0, n), lhs.dtype)
    tiles = tiles or choose_tiles(m, k, n, num_groups, rhs.dtype)
    tm, tk, tn = tiles.row_tile, tiles.contraction_tile, tiles.column_tile
    if tm % 16 or (tk != k and tk % 128) or (tn != n and tn % 128):
        raise ValueError(f"tiles: rows must be a multiple of 16, k and n tiles all of the dim or a multiple of 128; "
                         f"got {tiles} for k={k}, n={n}")
    num_row_tiles, num_k_tiles = -(-m // tm), -(-k // tk)
    # Whole row tiles and whole k tiles of lhs: zero rows and columns (activations; the weights are never padded).
    lhs = jnp.pad(lhs, ((0, num_row_tiles * tm - m), (0, num_k_tiles * tk - k)))
    schedule = visit_schedule(group_sizes, m, num_row_tiles, tm)
    num_visits = max_visits(num_row_tiles, num_groups)

    def lhs_block(j, visit, kk, groups, row_tiles, *_):
        return row_tiles[visit], kk

    def rhs_block(j, visit, kk, groups, *_):
        return groups[visit], kk, j

    def scale_block(j, visit, kk, groups, *_):
        return groups[visit], 0, j

    def out_block(j, visit, kk, groups, row_tiles, *_):
        return row_tiles[visit], j

    in_specs = [pl.BlockSpec((tm, tk), lhs_block), pl.BlockSpec((None, tk, tn), rhs_block)]
    operands = [lhs, rhs]
    if rhs_scale is not None:
        in_specs.append(pl.BlockSpec((None, 1, tn), scale_block))
        operands.append(rhs_scale.reshape(num_groups, 1, n))
    limit = vmem_limit_bytes or max(default_vmem_limit_bytes(), vmem_bytes(tiles, lhs.dtype, rhs.dtype))
    out = pl.pallas_call(
        functools.partial(_kernel, num_k_tiles=num_k_tiles, k_tail=k - (num_k_tiles - 1) * tk if k % tk else 0,
                          has_scale=rhs_scale is not None),
        out_shape=jax.ShapeDtypeStruct((num_row_tiles * tm, n), lhs.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(-(-n // tn), num_visits, num_k_tiles), in_specs=in_specs,
            out_specs=pl.BlockSpec((tm, tn), out_block),
            scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)]),
        # Column tiles are independent (a megacore chip splits them); visits of one tile must run in order.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                             vmem_limit_bytes=limit),
        cost_estimate=pl.CostEstimate(flops=2 * m * k * n, transcendentals=0,
                                      bytes_accessed=rhs.size * rhs.dtype.itemsize + lhs.size * lhs.dtype.itemsize
                                      + m * n * lhs.dtype.itemsize),
        interpret=pltpu.InterpretParams() if interpret is True else interpret,
    )(*schedule.arrays(), *operands)
    return out[:m]
