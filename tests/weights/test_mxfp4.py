"""MXFP4 expert weights (gpt-oss's `*_blocks` / `*_scales`): dequantized as transformers dequantizes them, and as
the OCP format defines on hand-worked bytes."""

import ml_dtypes
import numpy as np
import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from jaxpaged.weights.mxfp4 import dequantize_mxfp4, dequantized_parameter, is_mxfp4_checkpoint


def test_random_blocks_match_transformers_dequantization():
    """Random codes and scales over a wide exponent range give transformers' parameter exactly ([E, in, out], the
    transpose of the packed [E, out, in])."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 10, 4, 16), dtype=np.uint8)
    scales = rng.integers(100, 150, (3, 10, 4), dtype=np.uint8)
    expected = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    np.testing.assert_array_equal(np.swapaxes(dequantize_mxfp4(blocks, scales, np.float32), 1, 2), expected.numpy())
    parameter = dequantized_parameter(blocks, scales, "w")
    assert parameter.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(parameter.astype(np.float32), expected.numpy())


def test_bfloat16_output_is_exact():
    """Every FP4 value times a power of two is a bfloat16: the serving dtype's result equals the float32 one."""
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (2, 3, 2, 16), dtype=np.uint8)
    scales = rng.integers(1, 255, (2, 3, 2), dtype=np.uint8)
    bf16 = dequantize_mxfp4(blocks, scales)
    assert bf16.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(bf16.astype(np.float32), dequantize_mxfp4(blocks, scales, np.float32))


def test_hand_worked_bytes():
    """0x21 is codes 1 (0.5, low nibble first) and 2 (1.0); 0xF8 is -0.0 and -6.0; 0x7E is -4.0 and 6.0; a scale
    byte of 128 doubles the block, 126 halves it."""
    blocks = np.zeros((2, 1, 16), dtype=np.uint8)
    blocks[0, 0, :3] = [0x21, 0xF8, 0x7E]
    blocks[1, 0, 0] = 0x21
    scales = np.array([[128], [126]], dtype=np.uint8)
    got = dequantize_mxfp4(blocks, scales, np.float32)
    assert got.shape == (2, 32)
    np.testing.assert_array_equal(got[0, :6], [1.0, 2.0, -0.0, -12.0, -8.0, 12.0])
    assert np.signbit(got[0, 2])
    np.testing.assert_array_equal(got[0, 6:], 0.0)
    np.testing.assert_array_equal(got[1, :2], [0.25, 0.5])


@pytest.mark.parametrize("blocks_shape, scales_shape, dtype, match", [
    ((2, 4, 16), (2, 3), np.uint8, "scales' shape"),
    ((2, 4, 8), (2, 4), np.uint8, "16 bytes"),
    ((2, 4, 16), (2, 4), np.int8, "uint8"),
])
def test_malformed_tensors_are_refused(blocks_shape, scales_shape, dtype, match):
    """Blocks that do not match their scales, or are not uint8, raise a ValueError naming the tensor."""
    with pytest.raises(ValueError, match=f"w_blocks.*{match}"):
        dequantize_mxfp4(np.zeros(blocks_shape, dtype), np.zeros(scales_shape, np.uint8), name="w_blocks")


def test_nan_scale_is_refused():
    """E8M0 255 (NaN) is refused with the tensor's name rather than loaded as infinities."""
    with pytest.raises(ValueError, match="down_proj.*255"):
        dequantize_mxfp4(np.zeros((1, 2, 16), np.uint8), np.array([[127, 255]], np.uint8), name="down_proj")


def test_mxfp4_config_is_recognised():
    """gpt-oss's quantization_config names mxfp4; other configs do not."""
    assert is_mxfp4_checkpoint({"quantization_config": {"quant_method": "mxfp4"}})
    assert not is_mxfp4_checkpoint({"quantization_config": {"quant_method": "compressed-tensors"}})
    assert not is_mxfp4_checkpoint({})
