"""The native CPU grouped matmul's streamed path (grouped_stream.h: groups of 1 to 4 rows on weights as stored, walked
row by row in chunks) and its two-weight call (grouped_matmuls_cpu: a MoE's gate and up in one call): both equal
jax.lax.ragged_dot (times the int8 scales) at groups of 0, 1, 2, 3, 4 and 5 rows side by side, widths that are not
a multiple of the vector width, inner sizes that are not a multiple of the rows summed per pass and that cut into
several chunks, in float32, bfloat16 and int8; the chunks' sums add up in a fixed order, so repeated calls agree bit
for bit; empty groups' weights and padding rows reach no result."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.grouped_matmul import (
    FLAGS,
    SOURCE,
    grouped_matmul_available,
    grouped_matmul_cpu,
    grouped_matmuls_cpu,
)
from jaxpaged.kernels.cpu_native.native_build import register

DTYPES = (jnp.float32, jnp.bfloat16, jnp.int8)
EDGE_SIZES = (0, 1, 2, 0, 5, 3, 4, 0)
"""Streamed groups of 1 to 4 rows beside empty ones and a tiled group of 5."""
SHAPES = [(1, 1), (3, 17), (37, 45), (130, 16), (515, 256), (2051, 33)]
"""(inner, outer): one element; a column tail only; a tail after whole vectors; inner not a multiple of the 4 rows
summed per pass, one vector wide and 16 (one row's sums then stay in registers); enough weight bytes per group (270 KB
in float32) for several chunks."""


@pytest.fixture(autouse=True, scope="module")
def registered_kernels():
    """Built and registered in this worker before any test calls them."""
    assert all(grouped_matmul_available(dtype) for dtype in DTYPES)


def random_weight(rng, groups, inner, outer, dtype):
    """rhs [groups, inner, outer] in `dtype` (int8 with float32 scales [groups, outer]; others without scales)."""
    if dtype == jnp.int8:
        return (rng.integers(-127, 128, (groups, inner, outer)).astype(np.int8),
                rng.uniform(0.001, 0.02, (groups, outer)).astype(np.float32))
    return rng.standard_normal((groups, inner, outer)).astype(dtype), None


def reference(lhs, rhs, sizes, scale=None):
    """Each group's rows times its weight in float64 (times its scales), padding rows zero."""
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for group, size in enumerate(sizes):
        weight = np.asarray(rhs[group], np.float64) * (1.0 if scale is None else scale[group])
        out[start:start + size] = lhs[start:start + size].astype(np.float64) @ weight
        start += size
    return out


def assert_close(got, expected, inner):
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5 * np.sqrt(inner) * max(1.0, np.abs(expected).max()))


def operands(lhs, rhs, sizes, scale):
    return (jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(np.asarray(sizes, np.int32)),
            None if scale is None else jnp.asarray(scale))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_groups_of_few_rows_equal_ragged_dot(dtype):
    """Groups of 0 to 5 rows side by side, 3 padding rows after them: each row its group's product, padding zeros."""
    rng = np.random.default_rng(11)
    for inner, outer in SHAPES:
        lhs = rng.standard_normal((sum(EDGE_SIZES) + 3, inner)).astype(np.float32)
        rhs, scale = random_weight(rng, len(EDGE_SIZES), inner, outer, dtype)
        got = np.asarray(grouped_matmul_cpu(*operands(lhs, rhs, EDGE_SIZES, scale)))
        assert_close(got, reference(lhs, rhs, EDGE_SIZES, scale), inner)
        np.testing.assert_array_equal(got[sum(EDGE_SIZES):], 0.0)


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_one_group_of_many_chunks_equals_its_product(rows):
    """A single streamed group (the chunks of one group spread over the threads) at every streamed row count."""
    rng = np.random.default_rng(rows)
    lhs = rng.standard_normal((rows, 4097)).astype(np.float32)
    rhs, _ = random_weight(rng, 3, 4097, 70, jnp.float32)
    sizes = (0, rows, 0)
    assert_close(np.asarray(grouped_matmul_cpu(*operands(lhs, rhs, sizes, None))), reference(lhs, rhs, sizes), 4097)


def test_repeated_calls_agree_bit_for_bit():
    """The chunks of a group are added in chunk order whichever thread ran them: the same operands, the same bits."""
    rng = np.random.default_rng(12)
    lhs = rng.standard_normal((8, 2048)).astype(np.float32)
    rhs, _ = random_weight(rng, 8, 2048, 96, jnp.float32)
    call = jax.jit(grouped_matmul_cpu)
    args = operands(lhs, rhs, (1,) * 8, None)
    first = np.asarray(call(*args))
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(call(*args)), first)


def test_empty_groups_weights_and_padding_rows_reach_no_streamed_result():
    """NaN weights in empty groups and NaN padding rows leave every streamed group's result finite and exact."""
    rng = np.random.default_rng(13)
    sizes = (0, 1, 0, 2, 0)
    lhs = rng.standard_normal((6, 300)).astype(np.float32)
    rhs, _ = random_weight(rng, 5, 300, 40, jnp.float32)
    poisoned, poisoned_lhs = rhs.copy(), lhs.copy()
    poisoned[[0, 2, 4]] = np.nan
    poisoned_lhs[3:] = np.nan
    got = np.asarray(grouped_matmul_cpu(*operands(poisoned_lhs, poisoned, sizes, None)))
    assert np.isfinite(got).all()
    lhs[3:] = 0.0
    assert_close(got, reference(lhs, rhs, sizes), 300)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_two_weights_in_one_call_equal_two_calls(dtype):
    """grouped_matmuls_cpu(lhs, (a, b)) is (lhs by a, lhs by b), widths differing, streamed and tiled groups alike,
    int8 each with its own scales."""
    rng = np.random.default_rng(14)
    sizes = (0, 1, 2, 5, 13, 0, 4)
    lhs = rng.standard_normal((sum(sizes) + 2, 75)).astype(np.float32)
    first, first_scale = random_weight(rng, len(sizes), 75, 45, dtype)
    second, second_scale = random_weight(rng, len(sizes), 75, 130, dtype)
    scales = None if first_scale is None else (jnp.asarray(first_scale), jnp.asarray(second_scale))
    got = grouped_matmuls_cpu(jnp.asarray(lhs), (jnp.asarray(first), jnp.asarray(second)),
                              jnp.asarray(np.asarray(sizes, np.int32)), scales)
    assert [g.shape for g in got] == [(lhs.shape[0], 45), (lhs.shape[0], 130)]
    assert_close(np.asarray(got[0]), reference(lhs, first, sizes, first_scale), 75)
    assert_close(np.asarray(got[1]), reference(lhs, second, sizes, second_scale), 75)


def test_a_two_weight_call_of_mismatched_operands_is_refused_by_name():
    """Mixed dtypes, scales on one weight only, or three weights are refused before any native code runs."""
    lhs, sizes = jnp.zeros((4, 8)), jnp.zeros((2,), jnp.int32)
    weight = jnp.zeros((2, 8, 16))
    with pytest.raises(ValueError, match="dtype"):
        grouped_matmuls_cpu(lhs, (weight, weight.astype(jnp.bfloat16)), sizes)
    with pytest.raises(ValueError, match="rhs_scale"):
        grouped_matmuls_cpu(lhs, (weight, weight), sizes, (jnp.ones((2, 16)), None))
    with pytest.raises(ValueError, match="weights"):
        grouped_matmuls_cpu(lhs, (weight, weight, weight), sizes)
    with pytest.raises((ValueError, TypeError), match="rhs"):
        grouped_matmuls_cpu(lhs, (weight, jnp.zeros((2, 9, 16))), sizes)


def test_the_moe_layers_gate_and_up_are_one_custom_call_on_the_cpu():
    """models/moe.py's expert_matmul_pair compiles to a single native call for both weights and keeps the product."""
    from jaxpaged.models.moe import expert_matmul_pair

    rng = np.random.default_rng(15)
    sizes = (1, 0, 2, 1)
    lhs = rng.standard_normal((5, 24)).astype(np.float32)
    gate, _ = random_weight(rng, 4, 24, 40, jnp.float32)
    up, _ = random_weight(rng, 4, 24, 40, jnp.float32)
    args = (jnp.asarray(lhs), jnp.asarray(gate), jnp.asarray(up), jnp.asarray(np.asarray(sizes, np.int32)))
    compiled = jax.jit(expert_matmul_pair).lower(*args).compile().as_text() or ""
    assert compiled.count('custom_call_target="jaxpaged_grouped_matmul"') == 1
    got_gate, got_up = expert_matmul_pair(*args)
    assert_close(np.asarray(got_gate), reference(lhs, gate, sizes), 24)
    assert_close(np.asarray(got_up), reference(lhs, up, sizes), 24)


def test_the_avx2_build_streams_the_same_products():
    """-mno-avx512f builds the 8-lane stream (registered under a target of its own): the same products, two weights."""
    rng = np.random.default_rng(16)
    for dtype, symbol in [(jnp.float32, "JaxpagedGroupedMatmul"), (jnp.bfloat16, "JaxpagedGroupedMatmulBfloat16"),
                          (jnp.int8, "JaxpagedGroupedMatmulInt8")]:
        target = f"jaxpaged_grouped_stream_avx2_test_{jnp.dtype(dtype).name}"
        assert register(SOURCE, (*FLAGS, "-mno-avx512f"), symbol, target, fallback="nothing")
        lhs = rng.standard_normal((sum(EDGE_SIZES), 301)).astype(np.float32)
        first, first_scale = random_weight(rng, len(EDGE_SIZES), 301, 21, dtype)
        second, second_scale = random_weight(rng, len(EDGE_SIZES), 301, 21, dtype)
        results = [jax.ShapeDtypeStruct((lhs.shape[0], 21), jnp.float32)] * 2
        scales = () if first_scale is None else (jnp.asarray(first_scale), jnp.asarray(second_scale))
        got = jax.ffi.ffi_call(target, results)(jnp.asarray(lhs), jnp.asarray(np.asarray(EDGE_SIZES, np.int32)),
                                                jnp.asarray(first), jnp.asarray(second), *scales)
        assert_close(np.asarray(got[0]), reference(lhs, first, EDGE_SIZES, first_scale), 301)
        assert_close(np.asarray(got[1]), reference(lhs, second, EDGE_SIZES, second_scale), 301)
