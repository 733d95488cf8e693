"""The native weight-only int8 matmul on the bfloat16 pair dot (int8_bf16_matmul.cc: int8 panels widened to bfloat16,
VDPBF16PS, float32 sums, column scales at the end) equals numpy's float64 product of the bfloat16-rounded rows and
the int8 weights times the scales, to float32 summation, at the edges of its tiling (rows 0, 1, 7, 12, 13, 64, 73;
inner odd, not a multiple of 4; 1, 3 and 5 panels around the 2-panel tile and the 4-panel item), with padding rows
zero; and through layers.matmuls it is what the float32-input int8 panels give, to the rows' bfloat16 rounding."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.int8_bf16_matmul import (
    int8_bf16_available,
    int8_bf16_matmuls,
    pack_int8_pairs,
    unpack_int8_pairs,
)

pytestmark = pytest.mark.skipif(not int8_bf16_available(), reason="this CPU has no AVX512-BF16")


def _operands(rng: np.random.Generator, rows: int, inner: int, outer: int):
    """Float rows with a wide spread, full-range int8 weights (the symmetric [-127, 127]), positive scales."""
    x = (rng.standard_normal((rows, inner)) * rng.uniform(0.1, 10.0, (rows, 1))).astype(np.float32)
    values = rng.integers(-127, 128, (inner, outer), dtype=np.int8)
    return x, values, rng.uniform(1e-3, 1.0, outer).astype(np.float32)


def _reference(x: np.ndarray, values: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The spec in float64 (bfloat16(x) @ W * scale) and the bound on float32 summation error per element."""
    rounded = np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)
    exact = rounded @ values.astype(np.float64) * scale
    magnitude = np.abs(rounded) @ np.abs(values.astype(np.float64)) * scale
    return exact, magnitude * x.shape[1] * 2.0**-24


@pytest.mark.parametrize("inner", [1, 2, 7, 70, 131])
def test_packing_round_trips_in_pair_order(inner):
    """pack_int8_pairs keeps every weight (unpack gives it back), pads an odd inner size with a zero row, and holds
    (W[2i, c], W[2i + 1, c]) adjacent in each panel row."""
    values = np.random.default_rng(inner).integers(-127, 128, (inner, 48), dtype=np.int8)
    panels = pack_int8_pairs(values)
    assert panels.dtype == np.int8 and panels.shape == (3, inner + inner % 2, 16)
    np.testing.assert_array_equal(unpack_int8_pairs(panels, inner), values)
    if inner >= 2:  # panel 1, pair row 0, column 16 + 3: bytes 6 and 7 of the row
        assert tuple(panels[1].reshape(-1, 32)[0, 6:8]) == (values[0, 19], values[1, 19])
    np.testing.assert_array_equal(pack_int8_pairs(np.ascontiguousarray(values.T).T), panels)  # a transposed view


@pytest.mark.parametrize("rows", [0, 1, 7, 12, 13, 64, 73])
@pytest.mark.parametrize("inner,outer", [(1, 16), (7, 48), (70, 80), (130, 32)])
def test_the_product_equals_the_bfloat16_rounded_reference(rows, inner, outer):
    """Every result is within float32 summation error of the float64 product of the rounded rows."""
    x, values, scale = _operands(np.random.default_rng(rows * 1000 + inner + outer), rows, inner, outer)
    (got,) = int8_bf16_matmuls(jnp.asarray(x), [jnp.asarray(pack_int8_pairs(values))], [jnp.asarray(scale)])
    got = np.asarray(got)
    assert got.shape == (rows, outer) and got.dtype == np.float32
    exact, tolerance = _reference(x, values, scale)
    assert np.all(np.abs(got - exact) <= tolerance + 1e-30)


@pytest.mark.parametrize("rows,num_rows", [(8, 3), (64, 0), (80, 75)])
def test_fused_weights_scale_their_own_columns_and_zero_the_padding(rows, num_rows):
    """One call with three weights (q, k, v): each result its own product; rows from num_rows on are zeros."""
    rng = np.random.default_rng(rows + num_rows)
    x = _operands(rng, rows, 70, 16)[0]
    weights = [_operands(rng, 1, 70, outer)[1:] for outer in (64, 32, 48)]  # (values, scale) each
    got = int8_bf16_matmuls(jnp.asarray(x), [jnp.asarray(pack_int8_pairs(v)) for v, _ in weights],
                            [jnp.asarray(s) for _, s in weights], num_rows=jnp.int32(num_rows))
    for product, (values, scale) in zip(got, weights):
        product = np.asarray(product)
        exact, tolerance = _reference(x[:num_rows], values, scale)
        assert np.all(np.abs(product[:num_rows] - exact) <= tolerance + 1e-30)
        assert np.all(product[num_rows:] == 0)


@pytest.mark.parametrize("rows", [1, 17, 64])
def test_matmuls_on_bf16_panels_give_the_int8_panels_product_to_bfloat16_rounding(rows):
    """layers.matmuls with Int8Bf16Weight against the same int8 values as float32-input int8 panels: the products
    differ only by the rows' bfloat16 rounding (relative 2^-9 per input), far below int8's own rounding."""
    from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_int8_available
    from jaxpaged.models.int8_bf16_weights import Int8Bf16Weight
    from jaxpaged.models.int8_weights import Int8Weight, dequantize_int8, quantize_int8
    from jaxpaged.models.layers import matmuls

    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 66)).astype(np.float32)
    quantized = [quantize_int8(rng.standard_normal((66, outer)).astype(np.float32)) for outer in (64, 32)]
    ours = matmuls(jnp.asarray(x), [Int8Bf16Weight(jnp.asarray(pack_int8_pairs(v)), jnp.asarray(s))
                                    for v, s in quantized])
    for product, (values, scale) in zip(ours, quantized):
        assert product.dtype == jnp.float32 and product.shape == (rows, values.shape[1])
        float_input = x.astype(np.float64) @ dequantize_int8(values, scale).astype(np.float64)
        bound = np.abs(x) @ np.abs(dequantize_int8(values, scale)) * 2.0**-8
        assert np.all(np.abs(np.asarray(product) - float_input) <= bound)
    if packed_int8_available():
        panels = matmuls(jnp.asarray(x), [Int8Weight(jnp.asarray(pack_panels(v)), jnp.asarray(s))
                                          for v, s in quantized])
        for mine, theirs in zip(ours, panels):
            np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=0.05,
                                       atol=0.02 * float(np.abs(theirs).max()))


def test_a_call_refuses_weights_without_their_scales_and_packing_refuses_partial_panels():
    """A weight without its scales, or an outer size that is no whole number of panels: refused, named."""
    with pytest.raises(ValueError, match="each with its scales"):
        int8_bf16_matmuls(jnp.zeros((2, 16)), [jnp.zeros((1, 16, 16), jnp.int8)], [])
    with pytest.raises(ValueError, match="pack_int8_pairs: int8 weight"):
        pack_int8_pairs(np.zeros((8, 20), np.int8))
