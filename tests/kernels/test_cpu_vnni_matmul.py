"""The native VNNI w8a8 matmul (vnni_matmul.cc: VPDPBUSD against weights packed with their column corrections)
equals numpy's exact int64 dot of the int8 operands times both scales, bit for bit, at the edges of its tiling (rows
0, 1, around the 12-row tile and the 72-row item; inner not a multiple of 4 or 64; panel counts around a 4-panel
item), with padding rows zero; the ymm (AVX-VNNI) tiling is checked on an AVX-512 VNNI machine too; and through
layers.matmuls it gives what XLA's w8a8 dot gives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.native_build import BASE_FLAGS, register
from jaxpaged.kernels.cpu_native.vnni_matmul import (
    SOURCE,
    pack_vnni,
    unpack_vnni,
    vnni_available,
    vnni_matmuls,
    vnni_packed_shape,
)

pytestmark = pytest.mark.skipif(not vnni_available(), reason="this CPU has no VPDPBUSD (AVX-512 VNNI / AVX-VNNI)")


def _operands(rng: np.random.Generator, rows: int, inner: int, outer: int):
    """Full-range int8 x and W (-128 included, the extreme of the +128 shift), positive scales, one zero row scale."""
    x = rng.integers(-128, 128, (rows, inner), dtype=np.int8)
    values = rng.integers(-128, 128, (inner, outer), dtype=np.int8)
    row_scale = rng.uniform(1e-3, 1.0, (rows, 1)).astype(np.float32)
    if rows:
        row_scale[rows // 2] = 0  # an all-zero (padding) row's scale
    return x, values, row_scale, rng.uniform(1e-3, 1.0, outer).astype(np.float32)


def _reference(x, values, row_scale, scale) -> np.ndarray:
    """The spec: the exact integer dot, then float32(sum) * row scale * column scale, in that order."""
    exact = (x.astype(np.int64) @ values.astype(np.int64)).astype(np.float32)
    return exact * row_scale * scale


@pytest.mark.parametrize("inner", [1, 3, 5, 64, 66, 130])
def test_packing_round_trips_and_holds_the_column_corrections(inner):
    """pack_vnni keeps every weight (unpack_vnni gives it back) and each panel's last row is 128 x its column sums."""
    values = np.random.default_rng(inner).integers(-128, 128, (inner, 48), dtype=np.int8)
    panels = pack_vnni(values)
    assert panels.dtype == np.int8 and panels.shape == vnni_packed_shape(inner, 48) == (3, -(-inner // 4) + 1, 64)
    np.testing.assert_array_equal(unpack_vnni(panels, inner), values)
    corrections = np.ascontiguousarray(panels[:, -1]).view("<i4").reshape(48)
    np.testing.assert_array_equal(corrections, 128 * values.astype(np.int64).sum(axis=0))
    np.testing.assert_array_equal(pack_vnni(np.ascontiguousarray(values.T).T), panels)  # a transposed view


@pytest.mark.parametrize("rows", [0, 1, 5, 11, 12, 13, 72, 73, 150])
@pytest.mark.parametrize("inner,outer", [(1, 16), (7, 32), (64, 80), (130, 144)])
def test_the_vnni_product_equals_the_exact_integer_dot(rows, inner, outer):
    """Every product is an exact int32 sum, so the result equals the reference bit for bit."""
    x, values, row_scale, scale = _operands(np.random.default_rng(rows * 1000 + inner + outer), rows, inner, outer)
    (got,) = vnni_matmuls(jnp.asarray(x), jnp.asarray(row_scale), [jnp.asarray(pack_vnni(values))],
                          [jnp.asarray(scale)])
    got = np.asarray(got)
    assert got.shape == (rows, outer) and got.dtype == np.float32
    np.testing.assert_array_equal(got, _reference(x, values, row_scale, scale))


def test_the_extreme_sums_do_not_overflow():
    """All -128 against all -128 / +127 at a wide inner: the largest |sum| the shift and correction can produce."""
    inner = 4099
    x = np.full((2, inner), -128, np.int8)
    values = np.stack([np.full(inner, -128, np.int8), np.full(inner, 127, np.int8)] * 8, axis=1)
    ones = np.ones((2, 1), np.float32)
    (got,) = vnni_matmuls(jnp.asarray(x), jnp.asarray(ones), [jnp.asarray(pack_vnni(values))],
                          [jnp.ones(16, jnp.float32)])
    np.testing.assert_array_equal(np.asarray(got), _reference(x, values, ones, np.ones(16, np.float32)))


@pytest.mark.parametrize("rows,num_rows", [(8, 3), (64, 0), (80, 75)])
def test_fused_weights_scale_their_own_columns_and_zero_the_padding(rows, num_rows):
    """One call with three weights (q, k, v): each result its own product; rows from num_rows on are zeros."""
    rng = np.random.default_rng(rows + num_rows)
    x, _, row_scale, _ = _operands(rng, rows, 70, 16)
    weights = [_operands(rng, 1, 70, outer)[1::2] for outer in (64, 32, 48)]  # (values, scale) each
    got = vnni_matmuls(jnp.asarray(x), jnp.asarray(row_scale), [jnp.asarray(pack_vnni(v)) for v, _ in weights],
                       [jnp.asarray(s) for _, s in weights], num_rows=jnp.int32(num_rows))
    for product, (values, scale) in zip(got, weights):
        product = np.asarray(product)
        np.testing.assert_array_equal(product[:num_rows], _reference(x, values, row_scale, scale)[:num_rows])
        assert np.all(product[num_rows:] == 0)


def test_the_ymm_tiling_equals_the_exact_dot_too():
    """The AVX-VNNI build (6 x 16 tile, two ymm halves per panel row), forced on this CPU."""
    target = "jaxpaged_vnni_matmul_ymm_test"
    assert register(SOURCE, (*BASE_FLAGS, "-DJAXPAGED_VNNI_YMM"), "JaxpagedVnniMatmul", target, fallback="nothing")
    rng = np.random.default_rng(7)
    for rows, inner, outer in [(1, 5, 16), (7, 64, 80), (73, 130, 144)]:
        x, values, row_scale, scale = _operands(rng, rows, inner, outer)
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, outer), jnp.float32))
        got = call(jnp.asarray(x), jnp.asarray(row_scale.reshape(rows)), jnp.int32(rows),
                   jnp.asarray(pack_vnni(values)), jnp.asarray(scale))
        np.testing.assert_array_equal(np.asarray(got), _reference(x, values, row_scale, scale))


@pytest.mark.parametrize("rows", [1, 17, 64])
def test_matmuls_on_vnni_weights_equal_xlas_w8a8(rows):
    """layers.matmuls with VnniW8A8Weight gives XLA's w8a8 product (same row quantization, exact int32 sums)."""
    from jaxpaged.models.int8_activations import VnniW8A8Weight, W8A8Weight
    from jaxpaged.models.int8_weights import quantize_int8
    from jaxpaged.models.layers import matmuls

    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.standard_normal((rows, 66)).astype(np.float32))
    quantized = [quantize_int8(rng.standard_normal((66, outer)).astype(np.float32)) for outer in (64, 32)]
    xla = matmuls(x, [W8A8Weight(jnp.asarray(v), jnp.asarray(s)) for v, s in quantized])
    vnni = matmuls(x, [VnniW8A8Weight(jnp.asarray(pack_vnni(v)), jnp.asarray(s)) for v, s in quantized])
    for mine, theirs in zip(vnni, xla):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


def test_a_call_refuses_weights_without_their_scales():
    """A weight without its scales is refused before the kernel runs, naming what is missing."""
    with pytest.raises(ValueError, match="each with its scales"):
        vnni_matmuls(jnp.zeros((2, 16), jnp.int8), jnp.ones((2, 1)), [jnp.zeros((1, 5, 64), jnp.int8)], [])


@pytest.mark.parametrize("rows", [1, 17])
def test_int16_digits_on_vnni_equal_the_digits_on_xlas_int8_dot(rows):
    """Weight-only int8 with 16-bit inputs ("vnni digits"): the same exact digit sums as int16_activations' XLA
    path, combined in float32 (so equal to float32 rounding), with the fused weights each their own."""
    from jaxpaged.models.int8_weights import quantize_int8
    from jaxpaged.models.int16_activations import VnniW8A16Weight, W8A16Weight
    from jaxpaged.models.layers import matmuls

    rng = np.random.default_rng(rows + 100)
    x = jnp.asarray(rng.standard_normal((rows, 66)).astype(np.float32))
    quantized = [quantize_int8(rng.standard_normal((66, outer)).astype(np.float32)) for outer in (64, 32)]
    xla = matmuls(x, [W8A16Weight(jnp.asarray(v), jnp.asarray(s)) for v, s in quantized])
    vnni = matmuls(x, [VnniW8A16Weight(jnp.asarray(pack_vnni(v)), jnp.asarray(s)) for v, s in quantized])
    for mine, theirs in zip(vnni, xla):
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-6, atol=1e-6 * np.abs(theirs).max())


def test_packing_refuses_what_the_kernel_cannot_sum_exactly():
    """Outer not whole panels, or an inner size whose int32 sums could wrap: refused, named."""
    from jaxpaged.kernels.cpu_native.vnni_matmul import MAX_INNER

    for bad in (np.zeros((8, 20), np.int8), np.zeros((MAX_INNER + 1, 16), np.int8)):
        with pytest.raises(ValueError, match="pack_vnni: int8 weight"):
            pack_vnni(bad)
