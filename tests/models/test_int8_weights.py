"""Weight-only int8 quantization on the host: the round trip's error bound, all-zero columns, checkpoint-ordered
(transposed) inputs, quantizing while layers stream in, and how the scales are sharded and counted."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxpaged.models.int8_weights import dequantize_int8, quantize_int8, quantize_params, scale_shapes
from jaxpaged.models.registry import read_model_config
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.memory_plan import weight_bytes_per_device, weight_format
from jaxpaged.weights.param_names import stack_layers
from tests.conftest import TINY_LLAMA

_FINITE = st.floats(-1e4, 1e4, allow_nan=False, allow_subnormal=False, width=32)


def _assert_within_half_a_step(weight: np.ndarray, values: np.ndarray, scale: np.ndarray) -> None:
    """|w - q * scale| <= scale / 2 per column (a float32 ulp of slack for the division and the product)."""
    error = np.abs(weight.astype(np.float64) - dequantize_int8(values, scale).astype(np.float64))
    slack = 4 * np.finfo(np.float32).eps * np.abs(weight).astype(np.float64)
    assert np.all(error <= scale[..., None, :].astype(np.float64) / 2 + slack)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=9), elements=_FINITE))
def test_round_trip_is_within_half_a_quantization_step(weight):
    values, scale = quantize_int8(weight)
    assert values.dtype == np.int8 and scale.dtype == np.float32
    assert values.shape == weight.shape and scale.shape == (*weight.shape[:-2], weight.shape[-1])
    assert np.all(np.abs(values.astype(np.int32)) <= 127)
    _assert_within_half_a_step(weight, values, scale)
    # Symmetric per column: the largest magnitude of a non-zero column lands on +-127.
    nonzero = scale > 0
    assert np.all(np.abs(values).max(axis=-2)[nonzero] == 127)


def test_an_all_zero_column_has_scale_zero_and_round_trips_exactly():
    weight = np.array([[0.0, 1.0, -3.0], [0.0, -0.5, 2.0]], np.float32)
    values, scale = quantize_int8(weight)
    assert scale[0] == 0 and np.all(values[:, 0] == 0)
    np.testing.assert_allclose(scale[1:], [1.0 / 127, 3.0 / 127], rtol=1e-7)
    assert values[:, 2].tolist() == [-127, round(2.0 / (3.0 / 127))]
    _assert_within_half_a_step(weight, values, scale)
    assert np.all(dequantize_int8(values, scale)[:, 0] == 0)


def test_a_checkpoint_ordered_view_quantizes_as_the_copy_does():
    """A transposed view (a checkpoint's [outer, inner] tensor seen as [inner, outer]) and bfloat16 inputs give what
    a contiguous float32 copy gives."""
    import ml_dtypes

    rows = np.random.default_rng(0).standard_normal((24, 40)).astype(ml_dtypes.bfloat16)
    view_values, view_scale = quantize_int8(rows.T)
    copy_values, copy_scale = quantize_int8(np.ascontiguousarray(rows.T.astype(np.float32)))
    np.testing.assert_array_equal(view_values, copy_values)
    np.testing.assert_array_equal(view_scale, copy_scale)


def test_streamed_quantization_while_loading_equals_quantizing_the_loaded_model():
    cfg = read_model_config(TINY_LLAMA | {"vocab_size": 64, "model_type": "llama"})
    rng = np.random.default_rng(1)
    tensors: dict[tuple[str, object], np.ndarray] = {}

    def fetch(name, layer):
        from jaxpaged.models.param_shapes import param_shapes

        key = (name, layer)
        if key not in tensors:
            shape = param_shapes(cfg)[name if layer is None else f"layers.{name}"]
            shape = shape if layer is None else shape[1:]
            # Projections arrive as checkpoints hold them: transposed views of [outer, inner] rows.
            tensors[key] = (rng.standard_normal(shape[::-1]).astype(np.float32).T if len(shape) == 2
                            else rng.standard_normal(shape).astype(np.float32))
        return tensors[key]

    streamed = stack_layers(cfg, fetch, quantization="int8")
    afterwards = quantize_params(stack_layers(cfg, fetch), "int8")
    assert sorted(streamed) == sorted(afterwards)
    assert set(scale_shapes(cfg, set(streamed))) == {f"layers.{n}_scale" for n in (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
    for name, value in afterwards.items():
        assert streamed[name].dtype == value.dtype, name
        np.testing.assert_array_equal(streamed[name], value, err_msg=name)
    assert streamed["layers.q_proj"].dtype == np.int8 and streamed["embed"].dtype == np.float32


def test_scales_shard_with_their_output_axis_and_count_as_float32():
    cfg = read_model_config(TINY_LLAMA | {"vocab_size": 64, "model_type": "llama"})
    layers, hidden, inner = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size
    assert mesh_lib.param_partition_spec("layers.gate_proj_scale", (layers, inner), cfg, 2) == mesh_lib.P(
        None, mesh_lib.MODEL_AXIS)
    assert mesh_lib.param_partition_spec("layers.down_proj_scale", (layers, hidden), cfg, 2) == mesh_lib.P()
    params = {"layers.gate_proj": np.zeros((layers, hidden, inner), np.int8),
              "layers.gate_proj_scale": np.zeros((layers, inner), np.float32),
              "layers.down_proj": np.zeros((layers, inner, hidden), np.int8),
              "layers.down_proj_scale": np.zeros((layers, hidden), np.float32),
              "final_norm": np.zeros((hidden,), np.float32)}
    int8_bytes = 2 * layers * hidden * inner
    assert weight_bytes_per_device(params, cfg, 1, "bfloat16") == (
        int8_bytes + 4 * layers * (inner + hidden) + 2 * hidden)
    assert weight_bytes_per_device(params, cfg, 2, "bfloat16") == (
        int8_bytes // 2 + 4 * layers * (inner // 2 + hidden) + 2 * hidden)
    assert weight_format(params, "bfloat16") == "int8 projections + bfloat16"
    assert weight_format({"final_norm": params["final_norm"]}, np.float32) == "float32"


def test_an_unknown_scheme_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="^quantization: unknown scheme 'int4'"):
        quantize_params({}, "int4")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("packed", [False, True])
def test_int8_matmuls_equal_the_dequantized_product(dtype, packed):
    """layers.matmuls on int8 weights (XLA's dot with the scales on its output, or int8 panels in the native kernel,
    q/k/v-like in one call) gives x @ dequantized W, rounded to x's dtype; padding rows are zero when packed."""
    import jax.numpy as jnp

    from jaxpaged.kernels.cpu_native.packed_matmul import pack_panels, packed_int8_available
    from jaxpaged.models.int8_weights import Int8Weight
    from jaxpaged.models.layers import matmuls

    assert packed_int8_available()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 64)).astype(np.float32)
    quantized = [quantize_int8(rng.standard_normal((64, outer)).astype(np.float32)) for outer in (64, 32, 48)]
    weights = [Int8Weight(jnp.asarray(pack_panels(values) if packed else values), jnp.asarray(scale))
               for values, scale in quantized]
    x_in = jnp.asarray(x, dtype)
    got = matmuls(x_in, weights, num_rows=jnp.int32(7) if packed else None)
    for product, (values, scale) in zip(got, quantized):
        assert product.dtype == jnp.dtype(dtype)
        expected = np.asarray(x_in, np.float64) @ dequantize_int8(values, scale).astype(np.float64)
        rows = 7 if packed else 9
        tolerance = 1e-5 if dtype == "float32" else 1e-2
        np.testing.assert_allclose(np.asarray(product[:rows], np.float64), expected[:rows], rtol=tolerance,
                                   atol=tolerance * np.abs(expected).max())
        if packed:
            assert np.all(np.asarray(product[rows:], np.float32) == 0)
