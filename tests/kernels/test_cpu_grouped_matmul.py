"""The native CPU grouped matmul (jaxpaged/kernels/cpu_native/grouped_matmul): it is really built and called, and equals
jax.lax.ragged_dot (times the int8 scales) at ragged group sizes, empty groups (first, middle, last), one group taking
every row, padding rows, groups longer than a row block, sizes that are not multiples of the register tile, in float32,
bfloat16 and int8 with scales. An empty group's weights are never read; padding rows are zeros whatever they hold. The
AVX2 tiling is built and checked too on a machine with AVX-512, where the default build takes the wider one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.grouped_matmul import (
    FLAGS,
    SOURCE,
    grouped_matmul_available,
    grouped_matmul_cpu,
    grouped_matmul_cpu_panels,
    pack_expert_panels,
    unpack_expert_panels,
)
from jaxpaged.kernels.cpu_native.native_build import register

DTYPES = (jnp.float32, jnp.bfloat16, jnp.int8)
# Jitted once here, as the model's step calls them: eagerly each of their ops compiled a program per shape.
matmul = jax.jit(grouped_matmul_cpu)
matmul_panels = jax.jit(grouped_matmul_cpu_panels, static_argnames="outer")


@pytest.fixture(autouse=True, scope="module")
def registered_kernels():
    """Built and registered in this worker before any test calls them (gcc is on every machine that runs the tests)."""
    assert all(grouped_matmul_available(dtype) for dtype in DTYPES)


def random_problem(rng, rows, inner, outer, sizes, dtype):
    """lhs float32 [rows, inner], rhs [groups, inner, outer] in `dtype` (int8: values in [-127, 127], with float32
    scales [groups, outer]; otherwise no scales), group_sizes int32."""
    lhs = rng.standard_normal((rows, inner)).astype(np.float32)
    if dtype == jnp.int8:
        rhs = rng.integers(-127, 128, (len(sizes), inner, outer)).astype(np.int8)
        scale = rng.uniform(0.001, 0.02, (len(sizes), outer)).astype(np.float32)
    else:
        rhs = rng.standard_normal((len(sizes), inner, outer)).astype(dtype)
        scale = None
    return lhs, rhs, np.asarray(sizes, np.int32), scale


def reference(lhs, rhs, group_sizes, scale=None):
    """What jax.lax.ragged_dot computes (times the int8 scales), as a float64 numpy loop over the groups: nothing to
    compile per shape. Rows past the groups' sum are zeros."""
    product = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for group, size in enumerate(np.asarray(group_sizes)):
        rows = slice(start, start + size)
        weights = np.asarray(rhs[group], np.float64) * (1.0 if scale is None else np.asarray(scale[group], np.float64))
        product[rows] = np.asarray(lhs[rows], np.float64) @ weights
        start += size
    return product


def assert_close(got, expected, inner):
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5 * np.sqrt(inner) * max(1.0, np.abs(expected).max()))


def test_the_kernel_is_built_and_in_the_compiled_program():
    """The jitted call holds the native custom call, not an XLA dot."""
    hlo = jax.jit(grouped_matmul_cpu).lower(jnp.zeros((4, 8)), jnp.zeros((2, 8, 16)),
                                            jnp.zeros((2,), jnp.int32)).as_text()
    assert "jaxpaged_grouped_matmul" in hlo


CASES = {  # (group sizes, padding rows after them)
    "ragged": ((3, 1, 17, 2, 9), 0),
    "empty first, middle and last": ((0, 5, 0, 13, 0), 3),
    "one group takes every row": ((0, 0, 40, 0), 0),
    "padding rows after the groups": ((2, 0, 7), 12),
    "a group longer than a row block": ((1, 150, 4), 2),
    "every group a tile and one row": ((13, 13, 13), 0),
    "one row each": ((1, 1, 1, 1, 1, 1, 1, 1), 56),
}
SHAPES = [(8, 16), (50, 70), (33, 96), (24, 200)]  # (inner, outer): whole vectors, tails of 6 columns, runs of 128


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("sizes,padding", CASES.values(), ids=CASES.keys())
def test_the_product_equals_ragged_dot(dtype, sizes, padding):
    """Each row is its group's product (times its scales), the padding rows are zeros: ragged_dot's result, from
    weights as stored and packed into panels alike."""
    rng = np.random.default_rng(sum(sizes) * 7 + len(sizes))
    for inner, outer in SHAPES:
        lhs, rhs, group_sizes, scale = random_problem(rng, sum(sizes) + padding, inner, outer, sizes, dtype)
        got = matmul(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes),
                     None if scale is None else jnp.asarray(scale))
        assert got.shape == (lhs.shape[0], outer) and got.dtype == jnp.float32
        expected = reference(lhs, rhs, group_sizes, scale)
        assert_close(np.asarray(got), expected, inner)
        from_panels = matmul_panels(jnp.asarray(lhs), jnp.asarray(pack_expert_panels(rhs)), jnp.asarray(group_sizes),
                                    None if scale is None else jnp.asarray(scale), outer=outer)
        assert_close(np.asarray(from_panels), expected, inner)


def test_padding_rows_are_zeros_whatever_they_hold():
    """Rows past the groups' sum hold NaN here: their results are zeros and the real rows are untouched by them."""
    rng = np.random.default_rng(3)
    lhs, rhs, group_sizes, _ = random_problem(rng, 64, 24, 48, (5, 0, 6), jnp.float32)
    lhs[11:] = np.nan
    got = np.asarray(jax.jit(grouped_matmul_cpu)(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)))
    np.testing.assert_array_equal(got[11:], 0.0)
    lhs[11:] = 0.0
    assert_close(got[:11], reference(lhs, rhs, group_sizes)[:11], 24)


def test_an_empty_groups_weights_are_never_read():
    """NaN weights in empty groups reach no result (a dense masked dot would multiply them by zero into NaN)."""
    rng = np.random.default_rng(4)
    lhs, rhs, group_sizes, _ = random_problem(rng, 20, 32, 64, (0, 8, 0, 12, 0), jnp.float32)
    poisoned = rhs.copy()
    poisoned[[0, 2, 4]] = np.nan
    got = np.asarray(grouped_matmul_cpu(jnp.asarray(lhs), jnp.asarray(poisoned), jnp.asarray(group_sizes)))
    assert np.isfinite(got).all()
    assert_close(got, reference(lhs, rhs, group_sizes), 32)


def test_traced_group_sizes_under_jit_give_each_batchs_product():
    """One compiled call serves different routings: the group sizes are read at run time, not at trace time."""
    rng = np.random.default_rng(5)
    call = jax.jit(grouped_matmul_cpu)
    lhs, rhs, _, _ = random_problem(rng, 24, 16, 32, (0, 0, 0, 0), jnp.float32)
    for sizes in [(24, 0, 0, 0), (0, 0, 0, 24), (6, 6, 6, 6), (0, 3, 0, 1)]:
        group_sizes = np.asarray(sizes, np.int32)
        assert_close(np.asarray(call(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes))),
                     reference(lhs, rhs, group_sizes), 16)


def test_sizes_past_the_rows_are_cut_at_the_last_row():
    """Group sizes summing past lhs's rows cover only the rows there are (negative sizes count as 0)."""
    rng = np.random.default_rng(6)
    lhs, rhs, _, _ = random_problem(rng, 10, 16, 16, (0, 0, 0), jnp.float32)
    got = np.asarray(grouped_matmul_cpu(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray([4, -2, 9], jnp.int32)))
    expected = np.concatenate([lhs[:4] @ rhs[0], lhs[4:] @ rhs[2]])
    assert_close(got, expected, 16)


def test_a_bfloat16_lhs_gives_a_bfloat16_result_of_float32_sums():
    """bfloat16 in, bfloat16 out (lhs's dtype): the float32 sums rounded once, as XLA's convert rounds them."""
    rng = np.random.default_rng(7)
    lhs, rhs, group_sizes, _ = random_problem(rng, 30, 40, 48, (7, 0, 20), jnp.bfloat16)
    lhs = lhs.astype(jnp.bfloat16)
    got = grouped_matmul_cpu(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes))
    assert got.dtype == jnp.bfloat16
    sums = reference(lhs.astype(np.float32), rhs, group_sizes)
    np.testing.assert_allclose(np.asarray(got, np.float32), sums, rtol=2 ** -8, atol=1e-3)


def test_every_output_column_comes_from_its_own_weight_column():
    """One-hot weights move input column j to output column perm[j] per group: a mixed-up lane or column shows."""
    inner, outer, sizes = 20, 70, (3, 13)
    rhs = np.zeros((2, inner, outer), np.float32)
    perms = [np.random.default_rng(g).permutation(outer)[:inner] for g in range(2)]
    for g, perm in enumerate(perms):
        rhs[g, np.arange(inner), perm] = 1.0
    lhs = np.arange(16 * inner, dtype=np.float32).reshape(16, inner)
    got = np.asarray(grouped_matmul_cpu(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes, jnp.int32)))
    expected = np.zeros((16, outer), np.float32)
    expected[:3, perms[0]] = lhs[:3]
    expected[3:, perms[1]] = lhs[3:]
    np.testing.assert_array_equal(got, expected)


def test_the_avx2_tiling_equals_ragged_dot_too():
    """-mno-avx512f builds the 6-row, 8-lane tiles whatever this CPU has; registered under a target of its own."""
    rng = np.random.default_rng(8)
    for dtype, symbol in [(jnp.float32, "JaxpagedGroupedMatmul"), (jnp.bfloat16, "JaxpagedGroupedMatmulBfloat16"),
                          (jnp.int8, "JaxpagedGroupedMatmulInt8")]:
        target = f"jaxpaged_grouped_matmul_avx2_test_{jnp.dtype(dtype).name}"
        assert register(SOURCE, (*FLAGS, "-mno-avx512f"), symbol, target, fallback="nothing")
        lhs, rhs, group_sizes, scale = random_problem(rng, 40, 50, 70, (5, 0, 7, 20), dtype)
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((40, 70), jnp.float32))
        got = call(jnp.asarray(lhs), jnp.asarray(group_sizes), jnp.asarray(rhs),
                   *(() if scale is None else (jnp.asarray(scale),)))
        assert_close(np.asarray(got), reference(lhs, rhs, group_sizes, scale), 50)
        got = call(jnp.asarray(lhs), jnp.asarray(group_sizes), jnp.asarray(pack_expert_panels(rhs)),
                   *(() if scale is None else (jnp.asarray(scale),)))
        assert_close(np.asarray(got), reference(lhs, rhs, group_sizes, scale), 50)


def test_bad_shapes_and_dtypes_are_refused_by_name():
    """A wrong operand is named before any native code runs (by jaxtyping's check where the tests install it)."""
    lhs, rhs, sizes = jnp.zeros((4, 8)), jnp.zeros((2, 8, 16)), jnp.zeros((2,), jnp.int32)
    with pytest.raises((ValueError, TypeError), match="group_sizes"):
        grouped_matmul_cpu(lhs, rhs, jnp.zeros((3,), jnp.int32))
    with pytest.raises((ValueError, TypeError), match="rhs_scale"):
        grouped_matmul_cpu(lhs, rhs, sizes, jnp.ones((2, 8)))
    with pytest.raises((ValueError, TypeError), match="dtype"):
        grouped_matmul_cpu(lhs, rhs.astype(jnp.float16), sizes)
    assert not grouped_matmul_available(jnp.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_the_moe_layers_expert_matmul_runs_this_kernel_on_the_cpu(dtype):
    """models/moe.py's expert_matmul compiles to this custom call on the CPU (no dense dot) and keeps its semantics."""
    from jaxpaged.models.moe import expert_matmul

    lhs, rhs, group_sizes, scale = random_problem(np.random.default_rng(9), 21, 24, 40, (4, 0, 9, 2), dtype)
    args = (jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes), None if scale is None else jnp.asarray(scale))
    compiled = jax.jit(expert_matmul).lower(*args).compile().as_text() or ""
    assert "jaxpaged_grouped_matmul" in compiled and "ragged" not in compiled
    assert_close(np.asarray(expert_matmul(*args)), reference(lhs, rhs, group_sizes, scale), 24)


def test_expert_panels_round_trip_and_hold_128_column_rows():
    """Panel p of group i holds columns 128p .. 128p + 127 of rhs[i], one contiguous row per inner index, the last
    panel zero-padded; unpacking gives the weights back."""
    weights = np.random.default_rng(10).standard_normal((3, 5, 300)).astype(jnp.bfloat16)
    panels = pack_expert_panels(weights)
    assert panels.shape == (3, 3, 5, 128) and panels.dtype == jnp.bfloat16
    np.testing.assert_array_equal(panels[2, 1, 4], weights[2, 4, 128:256])
    np.testing.assert_array_equal(panels[1, 2, 3, :44], weights[1, 3, 256:])
    np.testing.assert_array_equal(panels[:, 2, :, 44:].astype(np.float32), 0.0)
    np.testing.assert_array_equal(unpack_expert_panels(panels, 300), weights)


def test_panels_of_the_wrong_shape_are_refused_by_name():
    """Panels that do not match `outer` (too few, or not 128 wide) are named before any native code runs."""
    lhs, sizes = jnp.zeros((4, 8)), jnp.zeros((2,), jnp.int32)
    with pytest.raises((ValueError, TypeError), match="panels"):
        grouped_matmul_cpu_panels(lhs, jnp.zeros((2, 1, 8, 128)), sizes, outer=200)
    with pytest.raises((ValueError, TypeError), match="panels"):
        grouped_matmul_cpu_panels(lhs, jnp.zeros((2, 2, 8, 64)), sizes, outer=128)
