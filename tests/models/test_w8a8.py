"""w8a8 (int8 activations x int8 weights, int32 sums): the per-token activation round trip's bound, the matmul
against a plain numpy fake-quantized reference, and the engine running it (on the fly, and from a W8A8
compressed-tensors checkpoint) with the plan naming it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxpaged.models.int8_weights import dequantize_int8, quantize_int8
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA

# Rows whose largest value is under 127 x float32's smallest normal have a subnormal scale, which XLA:CPU flushes to
# zero (the row then reads back as zeros, an error of ~1e-36): the bound is stated for the values above that.
_MAGNITUDES = st.floats(2.0**-100, 1e4, allow_nan=False, allow_subnormal=False, width=32)
_FINITE = st.one_of(st.just(0.0), _MAGNITUDES, _MAGNITUDES.map(lambda value: -value))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=9), elements=_FINITE))
def test_per_token_round_trip_is_within_half_a_step(x):
    import jax.numpy as jnp

    from jaxpaged.models.int8_activations import quantize_rows

    values, scale = (np.asarray(a) for a in quantize_rows(jnp.asarray(x)))
    assert values.dtype == np.int8 and scale.shape == (x.shape[0], 1)
    error = np.abs(x.astype(np.float64) - values.astype(np.float64) * scale)
    assert np.all(error <= scale.astype(np.float64) / 2 + 4 * np.finfo(np.float32).eps * np.abs(x))
    nonzero = scale[:, 0] > 0
    assert np.all(np.abs(values.astype(np.int32)).max(axis=1)[nonzero] == 127)
    assert np.all(values[~nonzero] == 0)


def _fake_quantized_product(x: np.ndarray, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The spec in numpy, float64: each row of x rounded to int8 steps of max|row| / 127, times the dequantized
    weight."""
    row_scale = np.abs(x).max(axis=1, keepdims=True) / 127
    rounded = np.clip(np.rint(x / np.where(row_scale > 0, row_scale, 1)), -127, 127) * row_scale
    return rounded @ dequantize_int8(values, scale).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 15, 17, 64])
def test_w8a8_matmuls_equal_the_fake_quantized_product(dtype, rows):
    """layers.matmuls on w8a8 weights (q/k/v-like, three at once) gives the fake-quantized product, rounded to x's
    dtype; zero (padding) rows give zeros."""
    import jax.numpy as jnp

    from jaxpaged.models.int8_activations import W8A8Weight
    from jaxpaged.models.layers import matmuls

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((rows, 64)).astype(np.float32), dtype)
    x = x.at[rows // 2].set(0) if rows > 1 else x
    quantized = [quantize_int8(rng.standard_normal((64, outer)).astype(np.float32)) for outer in (64, 32, 48)]
    got = matmuls(x, [W8A8Weight(jnp.asarray(values), jnp.asarray(scale)) for values, scale in quantized])
    for product, (values, scale) in zip(got, quantized):
        assert product.dtype == jnp.dtype(dtype)
        expected = _fake_quantized_product(np.asarray(x, np.float64), values, scale)
        tolerance = 1e-5 if dtype == "float32" else 1e-2
        np.testing.assert_allclose(np.asarray(product, np.float64), expected, rtol=tolerance,
                                   atol=tolerance * np.abs(expected).max())
        if rows > 1:
            assert np.all(np.asarray(product[rows // 2], np.float32) == 0)


def test_the_int32_sum_is_the_exact_integer_dot():
    """The accumulation is integer: the unscaled product of the quantized operands is exact, however large inner."""
    import jax.numpy as jnp

    from jaxpaged.models.int8_activations import W8A8Weight, quantize_rows, w8a8_product

    rng = np.random.default_rng(6)
    inner = 4096  # 127 * 127 * 4096 = 6.6e7: past float32's exact integers (2^24), well inside int32
    x = rng.standard_normal((3, inner)).astype(np.float32)
    values = rng.integers(-127, 128, (inner, 5), dtype=np.int8)
    ones = np.ones(5, np.float32)
    got = np.asarray(w8a8_product(jnp.asarray(x), W8A8Weight(jnp.asarray(values), jnp.asarray(ones))))
    x_values, x_scale = (np.asarray(a) for a in quantize_rows(jnp.asarray(x)))
    exact = x_values.astype(np.int64) @ values.astype(np.int64)
    np.testing.assert_allclose(got, exact * x_scale, rtol=1e-6)


def test_w8a8_engine_runs_xla_int8_dots_and_names_them(tiny_model_dir):
    from jaxpaged.config import EngineConfig
    from jaxpaged.llm import LLM

    assert EngineConfig.from_options(quantization="w8a8_int8").quantization == "w8a8"
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with LLM(str(tiny_model_dir), quantization="w8a8", **TINY_ENGINE_OPTIONS) as llm:
        plan = llm.engine.runner.plan
        # The native VNNI matmul where this CPU has it and it timed faster (tests/models/test_vnni_w8a8_engine.py).
        assert plan.quantization == "w8a8" and plan.int8_matmul in ("w8a8", "vnni w8a8")
        kernel = {"w8a8": "XLA int8 x int8 dot", "vnni w8a8": "native VNNI int8 x int8 (VPDPBUSD)"}[plan.int8_matmul]
        assert f"w8a8 projections: {kernel}" in plan.describe()
        tokens = llm.generate(["The capital of France is"], params)[0].outputs[0].token_ids
    assert len(tokens) == 8 and all(0 <= token < TINY_LLAMA["vocab_size"] for token in tokens)
