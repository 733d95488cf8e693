"""The Triton grouped matmul (pallas_kernels/grouped_matmul/gpu.py): its row blocks and tiles, the kernel in Pallas'
interpret mode at gpt-oss's 2880 against the ragged_dot reference, and its Triton lowering at the issue's real
MoE shapes (decode 64 and prefill 512 tokens of Qwen3-30B-A3B and gpt-oss-120b)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.grouped_matmul import grouped_matmul_gpu, grouped_matmul_reference
from pallas_kernels.grouped_matmul.gpu_schedule import (
    SHARED_MEMORY_BYTES,
    choose_gpu_tiles,
    max_row_blocks,
    pipeline_shared_bytes,
    row_blocks,
)
from pallas_kernels.grouped_matmul.tpu_tiles import GroupedMatmulTiles

# (group sizes, rows): empty groups first, between and last; a group of 37 rows spanning three 16-row blocks from
# an offset that is not a multiple of 16; one group taking every row; rows past sum(sizes); sizes adding up past
# the rows (cut at the last row); every group empty.
SCHEDULE_CASES = {
    "empty_between": ([0, 5, 0, 37, 1, 0], 48),
    "one_takes_all": ([0, 48, 0], 48),
    "padding_rows": ([3, 0, 11], 48),
    "sizes_past_rows": ([20, 30, 9], 40),
    "all_empty": ([0, 0, 0, 0], 16),
}
_jitted_row_blocks = jax.jit(row_blocks, static_argnums=(1, 2))


@pytest.mark.parametrize("name", list(SCHEDULE_CASES))
def test_row_blocks_cover_each_group_once_from_its_first_row(name):
    """Each non-empty group's rows (cut at num_rows) are covered by ceil(size / 16) blocks starting at its first
    row, 16 rows apart, inside the group and in group order; an empty group has no block; the rest are empty."""
    sizes, num_rows = SCHEDULE_CASES[name]
    blocks = _jitted_row_blocks(jnp.asarray(sizes, jnp.int32), num_rows, 16)
    groups, starts, ends = (np.asarray(a) for a in blocks)
    assert len(groups) == max_row_blocks(num_rows, len(sizes), 16)
    real = starts < ends
    expected, offset = [], 0
    for group, size in enumerate(sizes):
        end = min(offset + size, num_rows)
        expected += [(group, start, end) for start in range(offset, end, 16)]
        offset = end
    assert [(int(g), int(s), int(e)) for g, s, e in zip(groups[real], starts[real], ends[real])] == expected
    assert np.all(real[:len(expected)]) and not np.any(real[len(expected):]), "real blocks come first"


def test_max_row_blocks_bounds_every_sizing():
    """The static block count bounds sum ceil(size / tm) for the worst sizings: every group a single row, or one
    row over a multiple of the tile."""
    for num_rows, num_groups, tm in [(512, 128, 16), (4096, 128, 32), (40, 6, 16), (5, 8, 16)]:
        singles = [1] * min(num_rows, num_groups)
        over = [tm + 1] * (num_rows // (tm + 1))
        for sizes in (singles, over):
            assert sum(-(-s // tm) for s in sizes) <= max_row_blocks(num_rows, num_groups, tm)


@pytest.mark.parametrize("rows,groups,dtype,expected", [
    (64 * 8, 128, jnp.bfloat16, GroupedMatmulTiles(16, 128, 128)),   # Qwen3-30B-A3B decode: ~4 rows per expert
    (512 * 8, 128, jnp.bfloat16, GroupedMatmulTiles(32, 128, 128)),  # its prefill: 32 per expert
    (512 * 4, 128, jnp.bfloat16, GroupedMatmulTiles(16, 128, 128)),  # gpt-oss-120b prefill (top 4)
    (8192, 8, jnp.float32, GroupedMatmulTiles(64, 64, 128)),         # Mixtral-like, float32: rows capped, k halved
])
def test_gpu_tiles_follow_the_rows_per_group(rows, groups, dtype, expected):
    """Row tiles are the mean group size rounded up to a power of two within [16, 64]; k steps of 128 (64 in
    float32), 128 columns."""
    assert choose_gpu_tiles(rows, groups, dtype) == expected


def test_gpu_tiles_fit_shared_memory_with_room():
    """At any batch, every activation / weight dtype pair's chosen tiles, pipelined 3 deep (the default stages),
    take at most two thirds of an H100's shared memory (Triton adds its own layout buffers)."""
    for rows, groups in [(16, 128), (512, 128), (4096, 128), (65536, 8)]:
        for lhs_dtype, rhs_dtype in [(jnp.bfloat16, jnp.bfloat16), (jnp.bfloat16, jnp.int8),
                                     (jnp.float32, jnp.float32), (jnp.float32, jnp.int8)]:
            tiles = choose_gpu_tiles(rows, groups, lhs_dtype)
            assert pipeline_shared_bytes(tiles, lhs_dtype, rhs_dtype, 3) <= SHARED_MEMORY_BYTES * 2 // 3, tiles


def test_interpret_at_gpt_oss_width_2880():
    """bfloat16 at gpt-oss's hidden and expert width (k = n = 2880, neither a multiple of the 128-wide k steps and
    column tiles: both tails masked), the kernel's own tiles: an empty expert, a 37-row expert spanning three row
    blocks from an unaligned offset, and padding rows, against the ragged_dot reference; padding rows exactly 0."""
    rng = np.random.default_rng(0)
    k = n = 2880
    lhs = jnp.asarray(rng.standard_normal((48, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((3, k, n)) / np.sqrt(k), jnp.bfloat16)
    sizes = jnp.asarray([0, 37, 6], jnp.int32)
    out = np.asarray(grouped_matmul_gpu(lhs, rhs, sizes, interpret=True), np.float32)
    expected = np.asarray(grouped_matmul_reference(lhs, rhs, sizes), np.float32)
    np.testing.assert_allclose(out, expected, atol=3e-2, rtol=3e-2)
    assert np.all(out[43:] == 0)


@pytest.mark.parametrize("k,n", [(128, 128), (128, 96)], ids=["no_tail", "n_tail"])
def test_masks_only_where_a_dim_has_a_tail(k, n):
    """With 64 x 64 k and column tiles the kernel loads unmasked where k and n divide them and masks the columns
    where n has a tail (both tails: test_grouped_matmul.py); each way int8 weights with column scales equal the
    reference over ragged rows (an empty expert, a group over two row blocks, padding rows exactly 0)."""
    rng = np.random.default_rng(2)
    lhs = jnp.asarray(rng.standard_normal((40, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.integers(-127, 128, (3, k, n)), jnp.int8)
    scale = jnp.asarray(rng.uniform(0.5, 1.5, (3, n)) / (127 * np.sqrt(k)), jnp.float32)
    sizes = jnp.asarray([21, 0, 12], jnp.int32)
    out = grouped_matmul_gpu(lhs, rhs, sizes, scale, tiles=GroupedMatmulTiles(16, 64, 64), interpret=True)
    expected = np.asarray(grouped_matmul_reference(lhs, rhs, sizes, scale), np.float32)
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=3e-2, rtol=3e-2)
    assert np.all(np.asarray(out, np.float32)[33:] == 0)


def test_float16_activations_and_weights():
    """float16 (a GPU model served with dtype="half"), which the TPU kernel refuses: equal to the float32 reference
    within float16's rounding, the padding rows zero."""
    rng = np.random.default_rng(1)
    lhs = rng.standard_normal((40, 48)).astype(np.float16)
    rhs = (rng.standard_normal((4, 48, 40)) / np.sqrt(48)).astype(np.float16)
    sizes = jnp.asarray([9, 0, 20, 5], jnp.int32)
    out = grouped_matmul_gpu(jnp.asarray(lhs), jnp.asarray(rhs), sizes, interpret=True)
    assert out.dtype == jnp.float16
    expected = np.asarray(grouped_matmul_reference(jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32), sizes))
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=5e-3, rtol=5e-3)
    assert np.all(np.asarray(out)[34:] == 0)


# (name, rows, k, n): the three expert projections' shapes at decode (64 tokens) and prefill (512 tokens), rows =
# tokens x top-k. Qwen3-30B-A3B: 128 experts, top 8, hidden 2048, width 768 (gate / up [E, 2048, 768], down
# [E, 768, 2048]). gpt-oss-120b: 128 experts, top 4, hidden = width = 2880.
REAL_SHAPES = [
    ("qwen3_30b_a3b_gate_or_up_decode", 64 * 8, 2048, 768),
    ("qwen3_30b_a3b_down_decode", 64 * 8, 768, 2048),
    ("qwen3_30b_a3b_gate_or_up_prefill", 512 * 8, 2048, 768),
    ("qwen3_30b_a3b_down_prefill", 512 * 8, 768, 2048),
    ("gpt_oss_120b_decode", 64 * 4, 2880, 2880),
    ("gpt_oss_120b_prefill", 512 * 4, 2880, 2880),
]


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
@pytest.mark.parametrize("name,rows,k,n", REAL_SHAPES, ids=[shape[0] for shape in REAL_SHAPES])
def test_lowers_to_one_triton_call_at_real_shapes(name, rows, k, n, weights):
    """Pallas' Triton lowering accepts the kernel at every real MoE shape, bfloat16 or int8 experts with float32
    scales, bfloat16 activations, its own tiles: one Triton custom call, no ragged_dot, launched over
    (128-column tiles, row blocks), e.g. 6 x 160 at Qwen3-30B-A3B's decode."""
    args = [jax.ShapeDtypeStruct((rows, k), jnp.bfloat16), jax.ShapeDtypeStruct((128, k, n), jnp.dtype(weights)),
            jax.ShapeDtypeStruct((128,), jnp.int32)]
    if weights == "int8":
        args.append(jax.ShapeDtypeStruct((128, n), jnp.float32))
    text = grouped_matmul_gpu.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 1, name
    assert "ragged_dot" not in text, name
    tiles = choose_gpu_tiles(rows, 128, jnp.bfloat16)
    grid = tuple(int(re.search(rf"grid_{axis} = (\d+)", text).group(1)) for axis in "xy")  # type: ignore[union-attr]
    assert grid == (-(-n // 128), max_row_blocks(rows, 128, tiles.row_tile)), name
