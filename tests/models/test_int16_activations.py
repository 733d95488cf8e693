"""The int16-digit matmul (models/int16_activations.py): the digits stand for each row's 16-bit value exactly, the
product is within the bound that 16-bit rounding allows of the exact float64 product with the int8 weights, the int32
sums cannot overflow, and without a probe (several processes) the plan guesses it only where the CPU has int8 dot
units."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.models.int8_weights import quantize_int8
from jaxpaged.models.int16_activations import V_MAX, W8A16Weight, split_rows, w8a16_product
from jaxpaged.runner import int8_probe


def test_digits_of_a_hand_worked_row():
    # s = 1 / 32639: v = 32639, round(-12239.625) = -12240, round(8159.75) = 8160, 0.
    high, low, scale = split_rows(jnp.asarray([[1.0, -0.375, 0.25, 0.0]], jnp.float32))
    assert np.asarray(high).tolist() == [[127, -48, 32, 0]]  # floor((v + 128) / 256)
    assert np.asarray(low).tolist() == [[127, 48, -32, 0]]  # v - 256 * high
    np.testing.assert_allclose(np.asarray(scale), [[1 / V_MAX]], rtol=1e-7)


def test_digits_rebuild_every_row_within_half_a_step_and_stay_in_int8():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal((15, 257)) * 10.0 ** rng.integers(-6, 6, (15, 1)),
                        np.zeros((1, 257))]).astype(np.float32)  # rows over 12 decades, and a padding row
    high, low, scale = (np.asarray(a) for a in split_rows(jnp.asarray(x)))
    assert high.dtype == low.dtype == np.int8
    assert high.min() >= -127 and high.max() <= 127 and low.min() >= -128 and low.max() <= 127
    value = 256 * high.astype(np.int64) + low
    assert np.abs(value).max() <= V_MAX
    rebuilt = value * scale.astype(np.float64)
    assert np.all(np.abs(rebuilt - x) <= scale / 2 * (1 + 1e-6) + 1e-30)
    assert scale[-1, 0] == 0 and not value[-1].any()


@pytest.mark.parametrize("tokens", [1, 2, 16, 17])
def test_product_is_within_the_16_bit_bound_of_the_exact_product(tokens):
    rng = np.random.default_rng(tokens)
    inner, outer = 96, 48
    values, weight_scale = quantize_int8(rng.standard_normal((inner, outer)).astype(np.float32))
    x = rng.standard_normal((tokens, inner)).astype(np.float32)
    got = np.asarray(w8a16_product(jnp.asarray(x), W8A16Weight(jnp.asarray(values), jnp.asarray(weight_scale))))
    weight = values.astype(np.float64) * weight_scale
    exact = x.astype(np.float64) @ weight
    row_step = np.abs(x).max(axis=1, keepdims=True) / V_MAX
    bound = row_step / 2 * np.abs(weight).sum(axis=0) + 1e-6 * np.abs(x).astype(np.float64) @ np.abs(weight)
    assert got.shape == (tokens, outer) and got.dtype == np.float32
    assert np.all(np.abs(got - exact) <= bound)


def test_the_largest_digits_over_a_long_inner_axis_sum_exactly():
    # Every product at its largest (127 * 127, twice per digit pair) over 4,096 terms: int32 sums, no overflow.
    inner = 4096
    values = np.full((inner, 16), 127, np.int8)
    values[:, 1] = -127
    x = np.ones((2, inner), np.float32)
    x[1, ::2] = -1.0
    got = np.asarray(w8a16_product(jnp.asarray(x), W8A16Weight(jnp.asarray(values), jnp.ones(16, jnp.float32))))
    v = np.rint(x / (1 / V_MAX)).astype(np.int64)  # the rows' 16-bit values (all ±32639)
    exact = (v @ values.astype(np.int64)) / V_MAX
    np.testing.assert_allclose(got, exact, rtol=1e-6)
    assert got[0, 0] == pytest.approx(127 * inner)


@pytest.mark.parametrize("scheme, platform, units, per_layer, tp, native, expected", [
    (None, "cpu", True, True, 1, True, None),
    ("w8a8", "cpu", True, True, 1, True, "w8a8"),
    ("int8", "cpu", True, True, 1, True, "int16 digits"),
    ("int8", "cpu", True, True, 2, True, "int16 digits"),  # pure XLA: any tensor-parallel split
    ("int8", "cpu", False, True, 1, True, "panels"),
    ("int8", "cpu", False, True, 2, True, "xla"),  # the panels run on one device only
    ("int8", "cpu", True, True, 1, False, "xla"),  # cpu_matmul="xla"
    ("int8", "tpu", True, False, 8, True, "xla"),
    ("int8", "gpu", False, False, 1, True, "xla"),
])
def test_without_a_probe_the_plan_guesses_the_int8_matmul_by_platform_and_cpu(scheme, platform, units, per_layer, tp,
                                                                               native, expected, monkeypatch):
    """With no shapes to time (int8_probe.choose_int8_matmul), the CPU's flags and the arrangement pick."""
    monkeypatch.setattr(int8_probe, "cpu_has_int8_dot_units", lambda: units)
    assert int8_probe.choose_int8_matmul(scheme, platform, per_layer, tp, native) == expected
