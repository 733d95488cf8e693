"""The VNNI matmuls that quantize their float rows themselves (vnni_matmul.vnni_quantizing_matmuls, AVX-512 VNNI
builds) equal numpy's spec bit for bit, and XLA's paths too. w8a8: each row's scale max |x| / 127 and its values
round-half-even(x / scale) clipped to [-127, 127] (both divisions as multiplies by a float32 reciprocal, as XLA
compiles them) (an all-zero row: scale 0), the exact integer dot, then float32(sum) * row scale * column scale,
rounded to x's dtype; at the edges of the quantizing pass (inner not a multiple of 4 or 16) and of the tiling (rows
around the 12-row tile and the 72-row block), with padding rows zero; and through layers.matmuls it gives what
XLA's w8a8 gives, in float32 and bfloat16. Weight-only int8's digits: each row's scale max |x| / 32,639, v =
round-half-even(x / scale) split into int8 digits v = 256 hi + lo, (256 float32(hi @ W) + float32(lo @ W)) x row
scale x column scale, at the edges of the digit-pair tiles (6 pairs) and of the 36-row blocks."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.vnni_matmul import pack_vnni, quantizing_vnni_available, vnni_quantizing_matmuls

pytestmark = pytest.mark.skipif(not quantizing_vnni_available(), reason="no AVX-512 VNNI: XLA quantizes the rows")


def _spec(x: np.ndarray, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int8_activations' w8a8 in numpy as XLA compiles it (each division a multiply by a float32 reciprocal), float32
    throughout, before rounding to x's dtype."""
    x32 = x.astype(np.float32)
    row_scale = np.max(np.abs(x32), axis=1, keepdims=True) * (np.float32(1) / np.float32(127))
    inverse = np.float32(1) / np.where(row_scale > 0, row_scale, np.float32(1))
    q = np.clip(np.rint(x32 * inverse), -127, 127).astype(np.int64)
    exact = (q @ values.astype(np.int64)).astype(np.float32)
    return exact * row_scale * scale


def _operands(seed: int, rows: int, inner: int, outer: int):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, inner)) * rng.uniform(0.1, 10, (rows, 1))).astype(np.float32)
    if rows > 2:
        x[rows // 2] = 0  # an all-zero (padding) row
    values = rng.integers(-127, 128, (inner, outer), dtype=np.int8)
    return x, values, rng.uniform(1e-3, 1.0, outer).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 11, 12, 13, 73, 150])
@pytest.mark.parametrize("inner,outer", [(1, 16), (7, 32), (17, 48), (66, 80), (130, 144)])
def test_the_quantizing_product_equals_the_spec_in_float32(rows, inner, outer):
    """float32 rows: the kernel's quantization and product equal numpy's spec bit for bit."""
    x, values, scale = _operands(rows * 1000 + inner + outer, rows, inner, outer)
    (got,) = vnni_quantizing_matmuls(jnp.asarray(x), [jnp.asarray(pack_vnni(values))], [jnp.asarray(scale)])
    assert got.dtype == jnp.float32 and got.shape == (rows, outer)
    np.testing.assert_array_equal(np.asarray(got), _spec(x, values, scale))


@pytest.mark.parametrize("rows,inner", [(1, 576), (13, 35), (73, 66)])
def test_bfloat16_rows_give_the_spec_rounded_to_bfloat16(rows, inner):
    """bfloat16 rows: quantized from their exact float32 values, results rounded to nearest-even bfloat16."""
    x, values, scale = _operands(rows + inner, rows, inner, 64)
    x16 = x.astype(ml_dtypes.bfloat16)
    (got,) = vnni_quantizing_matmuls(jnp.asarray(x16), [jnp.asarray(pack_vnni(values))], [jnp.asarray(scale)])
    assert got.dtype == jnp.bfloat16
    want = _spec(x16.astype(np.float32), values, scale).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


def test_halves_round_to_even_and_the_largest_value_to_127():
    """x / scale exactly halfway between two integers goes to the even one, as jnp.round does (scale 1 here)."""
    x = np.array([[127.0, 2.5, -0.5, 1.5, 0.5, -3.5, -127.0, 0.0]], np.float32)
    identity = np.zeros((8, 16), np.int8)
    identity[np.arange(8), np.arange(8)] = 1
    (got,) = vnni_quantizing_matmuls(jnp.asarray(x), [jnp.asarray(pack_vnni(identity))],
                                     [jnp.ones(16, jnp.float32)])
    np.testing.assert_array_equal(np.asarray(got)[0, :8], [127, 2, 0, 2, 0, -4, -127, 0])


@pytest.mark.parametrize("num_rows", [0, 5, 13])
def test_fused_weights_and_padding_rows(num_rows):
    """Two weights in one call each get their own columns; rows from num_rows on are zeros."""
    x, first, scale = _operands(num_rows, 13, 40, 32)
    second = np.random.default_rng(1).integers(-127, 128, (40, 16), dtype=np.int8)
    got = vnni_quantizing_matmuls(jnp.asarray(x), [jnp.asarray(pack_vnni(first)), jnp.asarray(pack_vnni(second))],
                            [jnp.asarray(scale), jnp.asarray(scale[:16])], num_rows=jnp.int32(num_rows))
    for product, values, column_scale in zip(got, (first, second), (scale, scale[:16])):
        want = _spec(x, values, column_scale)
        want[num_rows:] = 0
        np.testing.assert_array_equal(np.asarray(product), want)


def _digits_spec(x: np.ndarray, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int16_activations' W8A16 in numpy as XLA compiles it (as _spec), float32 throughout, before rounding."""
    x32 = x.astype(np.float32)
    row_scale = np.max(np.abs(x32), axis=1, keepdims=True) * (np.float32(1) / np.float32(32639))
    inverse = np.float32(1) / np.where(row_scale > 0, row_scale, np.float32(1))
    v = np.clip(np.rint(x32 * inverse), -32639, 32639).astype(np.int64)
    high = np.floor_divide(v + 128, 256)
    low = v - 256 * high
    assert high.min() >= -127 and high.max() <= 127 and low.min() >= -128 and low.max() <= 127
    sums_high = (high @ values.astype(np.int64)).astype(np.float32)
    sums_low = (low @ values.astype(np.int64)).astype(np.float32)
    return (np.float32(256) * sums_high + sums_low) * row_scale * scale


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 36, 37, 150])
@pytest.mark.parametrize("inner,outer", [(1, 16), (7, 32), (17, 48), (130, 144)])
def test_the_digits_product_equals_the_spec_in_float32(rows, inner, outer):
    """Weight-only int8 on the digits: the kernel's split and product equal numpy's spec bit for bit."""
    x, values, scale = _operands(rows * 7 + inner + outer, rows, inner, outer)
    (got,) = vnni_quantizing_matmuls(jnp.asarray(x), [jnp.asarray(pack_vnni(values))], [jnp.asarray(scale)],
                                     digits=True)
    np.testing.assert_array_equal(np.asarray(got), _digits_spec(x, values, scale))


@pytest.mark.parametrize("num_rows", [0, 3, 13])
def test_digits_in_bfloat16_with_padding_rows(num_rows):
    """bfloat16 rows: the spec on their exact float32 values, rounded to bfloat16; rows from num_rows on are zeros."""
    x, values, scale = _operands(num_rows + 50, 13, 66, 32)
    x16 = x.astype(ml_dtypes.bfloat16)
    (got,) = vnni_quantizing_matmuls(jnp.asarray(x16), [jnp.asarray(pack_vnni(values))], [jnp.asarray(scale)],
                                     digits=True, num_rows=jnp.int32(num_rows))
    want = _digits_spec(x16.astype(np.float32), values, scale)
    want[num_rows:] = 0
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want.astype(ml_dtypes.bfloat16).view(np.uint16))


def _weight_classes(scheme: str) -> tuple[type, type]:
    """(XLA's weight class, the VNNI kernel's) for w8a8 or weight-only int8 on the digits."""
    from jaxpaged.models.int8_activations import VnniW8A8Weight, W8A8Weight
    from jaxpaged.models.int16_activations import VnniW8A16Weight, W8A16Weight

    return (W8A8Weight, VnniW8A8Weight) if scheme == "w8a8" else (W8A16Weight, VnniW8A16Weight)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("scheme,seed,rows", [("w8a8", 3, 21), ("digits", 4, 19)])
def test_matmuls_on_vnni_weights_equal_xlas_in_either_dtype(scheme, seed, rows, dtype):
    """layers.matmuls with the VNNI weights (the kernel quantizes the rows, or splits their digits) gives XLA's w8a8
    or int16-digits product bit for bit."""
    from jaxpaged.models.int8_weights import quantize_int8
    from jaxpaged.models.layers import matmuls

    xla_weight, vnni_weight = _weight_classes(scheme)
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((rows, 96)).astype(np.float32), dtype)
    quantized = [quantize_int8(rng.standard_normal((96, outer)).astype(np.float32)) for outer in (64, 32)]
    xla = matmuls(x, [xla_weight(jnp.asarray(v), jnp.asarray(s)) for v, s in quantized])
    vnni = matmuls(x, [vnni_weight(jnp.asarray(pack_vnni(v)), jnp.asarray(s)) for v, s in quantized])
    for mine, theirs in zip(vnni, xla):
        assert mine.dtype == theirs.dtype == dtype
        np.testing.assert_array_equal(np.asarray(mine.astype(jnp.float32)), np.asarray(theirs.astype(jnp.float32)))
