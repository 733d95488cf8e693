"""The native int8 matmul (packed_matmul.cc's Int8: int8 panels widened in registers, float32 sums, per-column scales
at the end) equals a float64 product of x and the dequantized weight at the edges of its tiling (rows around the
6- and 12-row tiles and the 72-row item, panel counts around a 4-panel item), with padding rows zero and fused
weights each getting their own scales; the AVX2 build is checked on an AVX-512 machine too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.native_build import register
from jaxpaged.kernels.cpu_native.packed_matmul import (
    FLAGS,
    SOURCE,
    pack_panels,
    packed_int8_available,
    packed_int8_matmuls,
    unpack_panels,
)
from jaxpaged.models.int8_weights import dequantize_int8, quantize_int8


@pytest.fixture(autouse=True, scope="module")
def registered_kernel():
    """Built and registered in this worker before any test calls it (gcc is on every machine that runs the tests)."""
    assert packed_int8_available()


def _int8_weight(rng: np.random.Generator, inner: int, outer: int) -> tuple[np.ndarray, np.ndarray]:
    values, scale = quantize_int8(rng.standard_normal((inner, outer)).astype(np.float32))
    scale[0] = 0  # an all-zero column's scale, as quantize_int8 gives it
    return values, scale


def _reference(x: np.ndarray, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ dequantize_int8(values, scale).astype(np.float64)


def test_int8_panels_round_trip_in_the_float32_order():
    values, _ = _int8_weight(np.random.default_rng(0), 24, 48)
    panels = pack_panels(values)
    assert panels.dtype == np.int8 and panels.shape == (3, 24, 16)
    np.testing.assert_array_equal(unpack_panels(panels), values)
    np.testing.assert_array_equal(pack_panels(np.ascontiguousarray(values.T).T), panels)  # a checkpoint's view


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 12, 13, 72, 73, 150])
@pytest.mark.parametrize("inner,outer", [(1, 16), (24, 64), (64, 80), (100, 144)])
def test_the_int8_product_equals_float64(rows, inner, outer):
    rng = np.random.default_rng(rows * 1000 + inner + outer)
    x = rng.standard_normal((rows, inner)).astype(np.float32)
    values, scale = _int8_weight(rng, inner, outer)
    (got,) = packed_int8_matmuls(jnp.asarray(x), [jnp.asarray(pack_panels(values))], [jnp.asarray(scale)])
    got = np.asarray(got)
    assert got.shape == (rows, outer) and got.dtype == np.float32
    expected = _reference(x, values, scale)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner) * scale.max(initial=1.0))
    assert np.all(got[:, 0] == 0)


@pytest.mark.parametrize("rows,num_rows", [(8, 3), (64, 0), (80, 75)])
def test_fused_int8_weights_scale_their_own_columns_and_zero_the_padding(rows, num_rows):
    rng = np.random.default_rng(rows + num_rows)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    weights = [_int8_weight(rng, 64, outer) for outer in (64, 32, 32)]
    got = packed_int8_matmuls(jnp.asarray(x), [jnp.asarray(pack_panels(v)) for v, _ in weights],
                              [jnp.asarray(s) for _, s in weights], num_rows=jnp.int32(num_rows))
    for product, (values, scale) in zip(got, weights):
        product = np.asarray(product)
        np.testing.assert_allclose(product[:num_rows], _reference(x[:num_rows], values, scale), rtol=1e-5,
                                   atol=1e-4 * scale.max())
        assert np.all(product[num_rows:] == 0)


def test_the_avx2_int8_tiling_equals_float64_too():
    # -mno-avx512f builds the 6 x 16 tile and the 8-byte widening loads whatever this CPU has.
    target = "jaxpaged_packed_matmul_int8_avx2_test"
    assert register(SOURCE, (*FLAGS, "-mno-avx512f"), "JaxpagedPackedMatmulInt8", target, fallback="nothing")
    rng = np.random.default_rng(7)
    for rows, inner, outer in [(1, 24, 16), (7, 64, 80), (73, 100, 144)]:
        x = rng.standard_normal((rows, inner)).astype(np.float32)
        values, scale = _int8_weight(rng, inner, outer)
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, outer), jnp.float32))
        got = np.asarray(call(jnp.asarray(x), jnp.int32(rows), jnp.asarray(pack_panels(values)), jnp.asarray(scale)))
        np.testing.assert_allclose(got, _reference(x, values, scale), rtol=1e-5, atol=1e-4 * scale.max())


def test_a_call_refuses_weights_without_their_scales():
    with pytest.raises(ValueError, match="each with its scales"):
        packed_int8_matmuls(jnp.zeros((2, 16)), [jnp.zeros((1, 16, 16), jnp.int8)], [])
