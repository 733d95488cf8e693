"""The grouped matmuls of pallas_kernels/grouped_matmul (TPU under the TPU interpreter, GPU in Pallas' interpret mode)
vs the ragged_dot reference, the TPU's visit schedule and Mosaic lowering (the GPU's row blocks, tiles and Triton
lowering: test_grouped_matmul_gpu.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.grouped_matmul import grouped_matmul, grouped_matmul_reference, pad_columns_to_lanes
from pallas_kernels.grouped_matmul.gpu import grouped_matmul_gpu
from pallas_kernels.grouped_matmul.tpu_schedule import FIRST_OF_TILE, HAS_GROUP, visit_schedule
from pallas_kernels.grouped_matmul.tpu_tiles import RHS_BLOCK_BYTES, GroupedMatmulTiles, choose_tiles

# Group sizes over 6 groups and 48 rows (row tiles of 16), one compile serving all of them: empty groups between
# others, one group taking every row, every group empty, sizes on and off the tile edges, groups spanning tiles,
# and rows past sum(group_sizes) (padding).
GROUP_SIZES = {
    "empty_between": [5, 0, 17, 0, 9, 3],
    "one_takes_all": [0, 0, 48, 0, 0, 0],
    "all_empty": [0, 0, 0, 0, 0, 0],
    "tile_aligned": [16, 16, 0, 16, 0, 0],
    "long_and_tiny": [1, 40, 1, 0, 0, 6],
    "last_only_padded": [0, 0, 0, 0, 0, 7],
}
NUM_ROWS = 48
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


def _operands(k: int, n: int, dtype, int8: bool, seed: int = 0):
    """lhs [48, k], rhs [6, k, n] (float or int8 with float32 column scales) scaled for O(1) outputs."""
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((NUM_ROWS, k)), dtype)
    if int8:
        rhs = jnp.asarray(rng.integers(-127, 128, (6, k, n)), jnp.int8)
        return lhs, rhs, jnp.asarray(rng.uniform(0.5, 1.5, (6, n)) / (127 * np.sqrt(k)), jnp.float32)
    return lhs, jnp.asarray(rng.standard_normal((6, k, n)) / np.sqrt(k), dtype), None


def _check_every_group_sizing(k: int, n: int, dtype, tiles, int8: bool = False, kernel_fn=grouped_matmul,
                              pad_columns: bool = False) -> None:
    """Every GROUP_SIZES case: kernel == reference within the dtype's tolerance, padding rows exactly zero.

    pad_columns: the kernel gets the weights (and scales) padded to 128-lane columns at load, the reference the
    unpadded ones; the extra output columns must be zero.
    """
    lhs, rhs, scale = _operands(k, n, dtype, int8)
    kernel_rhs, kernel_scale = pad_columns_to_lanes(rhs, scale) if pad_columns else (rhs, scale)
    kernel = jax.jit(functools.partial(kernel_fn, interpret=True, **({"tiles": tiles} if tiles else {})))
    for name, sizes in GROUP_SIZES.items():
        group_sizes = jnp.asarray(sizes, jnp.int32)
        out = kernel(lhs, kernel_rhs, group_sizes, kernel_scale)
        assert out.dtype == lhs.dtype and out.shape == (NUM_ROWS, kernel_rhs.shape[2]), name
        expected = np.asarray(grouped_matmul_reference(lhs, rhs, group_sizes, scale), np.float32)
        tolerance = TOLERANCE[jnp.dtype(dtype).name]
        out = np.asarray(out, np.float32)
        np.testing.assert_allclose(out[:, :n], expected, atol=tolerance, rtol=tolerance, err_msg=name)
        assert np.all(out[sum(sizes):] == 0), f"{name}: rows past sum(group_sizes) must be zero"
        assert np.all(out[:, n:] == 0), f"{name}: the lane-padding columns must be zero"
    assert kernel._cache_size() == 1, "group sizes are data: one compile serves them all"  # pyright: ignore[reportAttributeAccessIssue]


def test_float32_k_and_n_not_multiples_of_128():
    """float32, k = 200 in two k tiles (the second a partial block whose rows past k are masked, the interpreter
    filling them with NaN), n = 72 as one whole-width block."""
    _check_every_group_sizing(200, 72, jnp.float32, GroupedMatmulTiles(16, 128, 72))


def test_bfloat16_default_tiles_at_gpt_oss_widths_scaled_down():
    """bfloat16 in and out (float32 accumulation) at gpt-oss's hidden and expert width (2880, not a multiple of
    128) scaled by 1/8, with the tiles the kernel picks itself: k and n each one whole block."""
    assert choose_tiles(NUM_ROWS, 360, 360, 6, jnp.bfloat16) == GroupedMatmulTiles(16, 360, 360)
    _check_every_group_sizing(360, 360, jnp.bfloat16, None)


def test_int8_weights_padded_to_lanes_with_column_scales():
    """int8 weights times per-group, per-column float32 scales, bfloat16 activations; n = 360 padded at load to
    384 zero columns (pad_columns_to_lanes) in 256-column tiles (the second half past n), k = 160 with a masked
    tail: the first 360 columns are the unpadded reference's."""
    _check_every_group_sizing(160, 360, jnp.bfloat16, GroupedMatmulTiles(16, 128, 256), int8=True, pad_columns=True)


@pytest.mark.slow
def test_tpu_kernel_has_no_dma_races():
    """The TPU interpreter's race detector finds no conflicting DMA / compute accesses while row tiles are revisited
    by several groups, over k tiles and column tiles."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call
    from jax.experimental.pallas import tpu as pltpu

    lhs, rhs, _ = _operands(160, 256, jnp.float32, int8=False)
    sizes = jnp.asarray(GROUP_SIZES["empty_between"], jnp.int32)
    params = pltpu.InterpretParams(detect_races=True, dma_execution_mode="on_wait")
    out = grouped_matmul(lhs, rhs, sizes, tiles=GroupedMatmulTiles(16, 128, 128), interpret=params)
    np.testing.assert_allclose(np.asarray(out), np.asarray(grouped_matmul_reference(lhs, rhs, sizes)), atol=1e-4)
    races = interpret_pallas_call.races
    assert races is not None and not races.races_found


@pytest.mark.parametrize("rows", [64 * 8, 512 * 8])
@pytest.mark.parametrize("k,n", [(2048, 1536), (768, 2048), (2880, 5760), (2880, 2944)])
def test_default_tiles_keep_all_of_k_at_moe_shapes(rows, k, n):
    """At Qwen3-30B-A3B's and gpt-oss-120b's (lane-padded) expert shapes the default weight block holds all of k
    (a group spanning row tiles keeps its block: each expert read once per column tile) within RHS_BLOCK_BYTES, in
    whole 128-lane columns; row tiles stay small at decode (a few rows per expert) and grow at prefill."""
    for dtype in (jnp.bfloat16, jnp.int8):
        tiles = choose_tiles(rows, k, n, 128, dtype)
        assert tiles.contraction_tile == k
        assert k * tiles.column_tile * jnp.dtype(dtype).itemsize <= RHS_BLOCK_BYTES
        assert tiles.column_tile % 128 == 0 and -(-n // tiles.column_tile) <= 9
        assert tiles.row_tile == (16 if rows == 64 * 8 else 64)


def test_no_rows():
    """An empty batch (m = 0) gives an empty result without launching a kernel."""
    lhs, rhs, sizes = jnp.zeros((0, 64), jnp.float32), jnp.zeros((2, 64, 128), jnp.float32), jnp.zeros(2, jnp.int32)
    assert grouped_matmul(lhs, rhs, sizes, interpret=True).shape == (0, 128)
    assert grouped_matmul_gpu(lhs, rhs, sizes, interpret=True).shape == (0, 128)


_jitted_schedule = jax.jit(visit_schedule, static_argnums=(1, 2, 3))  # one compile, not one per eager op


@pytest.mark.parametrize("name", list(GROUP_SIZES))
def test_schedule_reads_each_non_empty_group_once(name):
    """The visit schedule names only non-empty groups, each in one run of consecutive visits (so with k in one
    block its weights are fetched once per column tile), covers every row tile, and zeroes each tile once."""
    sizes = GROUP_SIZES[name]
    schedule = _jitted_schedule(jnp.asarray(sizes, jnp.int32), NUM_ROWS, 3, 16)
    groups, tiles, flags = (np.asarray(a) for a in (schedule.group_ids, schedule.row_tiles, schedule.flags))
    non_empty = [group for group, size in enumerate(sizes) if size]
    multiplied = groups[(flags & HAS_GROUP) != 0]
    assert sorted(set(multiplied.tolist())) == non_empty
    weight_fetches = [groups[0]] + [g for previous, g in zip(groups, groups[1:]) if g != previous]
    assert sorted(weight_fetches) == (non_empty or [0])  # all empty: only the first step's block, see tpu_schedule
    assert sorted(tiles[(flags & FIRST_OF_TILE) != 0].tolist()) == [0, 1, 2]
    assert np.all(np.diff(tiles) >= 0), "visits of one row tile are consecutive"
    for visit in np.flatnonzero(flags & HAS_GROUP):
        start, end = sum(sizes[:groups[visit]]), sum(sizes[:groups[visit] + 1])
        assert start < (tiles[visit] + 1) * 16 and end > tiles[visit] * 16, "a group visits only tiles it overlaps"


def test_bad_inputs_name_the_argument():
    """Inputs that break the contract raise ValueError naming the argument."""
    lhs, rhs = jnp.zeros((16, 64), jnp.float32), jnp.zeros((2, 64, 128), jnp.float32)
    sizes = jnp.asarray([8, 8], jnp.int32)
    # Under the tests' run-time jaxtyping checks the annotation catches this one first (a TypeError naming it too).
    with pytest.raises((ValueError, TypeError), match="group_sizes"):
        grouped_matmul(lhs, rhs, sizes.astype(jnp.uint32), interpret=True)
    with pytest.raises(ValueError, match="rhs_scale: required"):
        grouped_matmul(lhs, rhs.astype(jnp.int8), sizes, interpret=True)
    with pytest.raises(ValueError, match="rhs: expected float32, bfloat16 or int8"):
        grouped_matmul(lhs, rhs.astype(jnp.float16), sizes, interpret=True)
    with pytest.raises(ValueError, match="tiles"):
        grouped_matmul(lhs, rhs, sizes, tiles=GroupedMatmulTiles(16, 64, 96), interpret=True)
    with pytest.raises(ValueError, match="tiles"):
        grouped_matmul(lhs, rhs, sizes, tiles=GroupedMatmulTiles(8, 64, 128), interpret=True)


def test_lowers_to_mosaic(monkeypatch):
    """Pallas' Mosaic lowering (TPU v5e rules) accepts the int8 kernel with a k tail; only libtpu's passes remain
    (`make tpu-compile` runs those at real shapes)."""
    from jax._src.pallas.mosaic import tpu_info

    monkeypatch.setitem(tpu_info.registry, jax.devices()[0].device_kind, lambda: (
        tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion.TPU_V5E, 1)))
    args = (jax.ShapeDtypeStruct((64, 320), jnp.bfloat16), jax.ShapeDtypeStruct((8, 320, 384), jnp.int8),
            jax.ShapeDtypeStruct((8,), jnp.int32), jax.ShapeDtypeStruct((8, 384), jnp.float32))
    kernel = jax.jit(functools.partial(grouped_matmul, tiles=GroupedMatmulTiles(32, 256, 128)))
    assert kernel.trace(*args).lower(lowering_platforms=("tpu",)).as_text().count("tpu_custom_call") == 1


def test_gpu_float32_k_and_n_tails():
    """The Triton kernel in float32: k = 200 over 64-deep steps and n = 72 over 64-wide tiles, both tails masked."""
    _check_every_group_sizing(200, 72, jnp.float32, GroupedMatmulTiles(16, 64, 64), kernel_fn=grouped_matmul_gpu)


def test_gpu_int8_weights_with_column_scales():
    """The Triton kernel with int8 weights and per-column scales, bfloat16 activations, its default tiles."""
    _check_every_group_sizing(96, 160, jnp.bfloat16, None, int8=True, kernel_fn=grouped_matmul_gpu)
