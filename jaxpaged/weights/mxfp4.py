"""MXFP4 expert weights as gpt-oss checkpoints ship them, dequantized on the host as they load.

OCP Microscaling FP4: each run of 32 consecutive values along a weight's input axis shares one E8M0 scale (a uint8
biased exponent: the scale is 2 ** (byte - 127)), and each value is an FP4 E2M1 code (1 sign, 2 exponent, 1 mantissa
bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives). gpt-oss stores a tensor `W` [experts, out, in] as
`W_blocks` uint8 [experts, out, in / 32, 16], two codes per byte (the low nibble is the even element, the high
nibble the odd one), and `W_scales` uint8 [experts, out, in / 32].

The engine keeps the dequantized values in the checkpoint's float dtype (bfloat16): every FP4 value times a power of
two is exact there. Keeping the experts 4-bit on the device would need a grouped matmul that unpacks nibbles and
applies per-32 scales inside its inner loop (none of the CPU, GPU or TPU kernels does), so it is not done here.
"""

import functools

import ml_dtypes
import numpy as np
from jaxtyping import UInt8
from numpy.typing import DTypeLike

FP4_E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                            -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
"""The value of each 4-bit E2M1 code (bit 3 is the sign)."""
E8M0_BIAS = 127
"""An E8M0 byte b means 2 ** (b - 127)."""
E8M0_NAN = 255
"""The E8M0 byte the OCP spec reserves for NaN: no real checkpoint holds it."""
VALUES_PER_BLOCK = 32
"""Values sharing one scale (16 bytes of codes)."""
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"
"""A quantized tensor `W` is stored as `W_blocks` and `W_scales`."""


def dequantize_mxfp4(blocks: UInt8[np.ndarray, "*rows num_blocks bytes"], scales: UInt8[np.ndarray, "*rows num_blocks"],
                     dtype: DTypeLike = ml_dtypes.bfloat16, name: str = "mxfp4 tensor") -> np.ndarray:
    """The values [*rows, num_blocks * 32] of packed MXFP4 `blocks` and their E8M0 `scales`, in `dtype`.

    Converted one leading slice (an expert) at a time by table lookup (_value_pairs), straight into `dtype`: the host
    holds the result and one slice's lookup indices, never a float32 copy. ValueError naming `name` on mismatched
    shapes or a NaN (255) scale.
    """
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(f"{name}: MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.ndim < 2 or blocks.shape[-1] != VALUES_PER_BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"{name}: MXFP4 blocks {blocks.shape} must be scales' shape {scales.shape} plus a last axis "
                         f"of {VALUES_PER_BLOCK // 2} bytes")
    if np.any(scales == E8M0_NAN):
        raise ValueError(f"{name}: an MXFP4 scale is 255, E8M0's NaN")
    out = np.empty((*scales.shape[:-1], scales.shape[-1] * VALUES_PER_BLOCK), dtype=dtype)
    if blocks.ndim == 2:
        out[...] = _dequantized_slice(blocks, scales, out.dtype)
        return out
    for index in range(blocks.shape[0]):
        out[index] = _dequantized_slice(blocks[index], scales[index], out.dtype)
    return out


@functools.lru_cache(maxsize=4)
def _value_pairs(dtype: np.dtype) -> np.ndarray:
    """[65536, 2] in `dtype`: row (scale byte << 8) | code byte holds the (even, odd) values that byte of two codes
    stands for under that scale (the low nibble first): every product of an FP4 value and a power of two, made once,
    so dequantizing is one table lookup per byte (no float32 copy, no multiply, no conversion)."""
    codes = np.arange(256)
    pairs = np.stack([FP4_E2M1_VALUES[codes & 0x0F], FP4_E2M1_VALUES[codes >> 4]], axis=-1)  # [byte, 2]
    scales = np.ldexp(1.0, np.arange(256) - E8M0_BIAS)  # float64: exact; 255 (NaN) is refused before any lookup
    with np.errstate(over="ignore"):  # 6 * 2 ** 127 is past float32's range: inf, as transformers' ldexp gives
        return (scales[:, None, None] * pairs[None]).astype(dtype).reshape(256 * 256, 2)


def _dequantized_slice(blocks: np.ndarray, scales: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One slice's values in `dtype`: each byte's pair of values looked up under its block's scale."""
    rows = (np.asarray(scales).astype(np.uint16) << 8)[..., None] | np.asarray(blocks)
    values = _value_pairs(dtype)[rows]
    return values.reshape(*values.shape[:-3], -1)


def is_mxfp4_checkpoint(hf_config: dict) -> bool:
    """Whether config.json says the checkpoint's experts are MXFP4 (gpt-oss's quantization_config)."""
    quantization = hf_config.get("quantization_config")
    return isinstance(quantization, dict) and quantization.get("quant_method") == "mxfp4"


class Mxfp4Parameter:
    """A parameter [experts, in, out] (bfloat16) a gpt-oss checkpoint stores as `name`_blocks / `name`_scales, not yet
    dequantized: `take` dequantizes only the output columns it is asked for.

    gpt-oss's gate_up_proj holds two parameters (gate in the even columns, up in the odd ones), each read by its own
    expert stack (models/expert_tensors.py); dequantizing the whole tensor for each would decode every code twice.
    The packed form runs its 32-value groups along the input axis, so it is [experts, out, in]: the output columns
    are whole rows of blocks, and selecting them before the lookup is exact.
    """

    def __init__(self, blocks: UInt8[np.ndarray, "experts out num_blocks bytes"],
                 scales: UInt8[np.ndarray, "experts out num_blocks"], name: str):
        if scales.ndim != 3:
            raise ValueError(f"{name}: MXFP4 expert scales must be [experts, out, blocks], got {scales.shape}")
        self.blocks, self.scales, self.name = blocks, scales, name
        experts, outer, num_blocks = scales.shape
        self.shape = (experts, num_blocks * VALUES_PER_BLOCK, outer)
        self.ndim = 3

    def take(self, columns: np.ndarray, axis: int) -> np.ndarray:
        """The dequantized parameter's `columns` of its output axis (axis 2 or -1), [experts, in, len(columns)]."""
        if axis not in (2, -1):
            raise ValueError(f"{self.name}: an MXFP4 parameter is selected along its output axis, not axis {axis}")
        values = dequantize_mxfp4(self.blocks[:, columns], self.scales[:, columns], name=self.name)
        return np.swapaxes(values, -1, -2)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The whole dequantized parameter [experts, in, out]."""
        values = self.take(np.arange(self.shape[2]), axis=2)
        return values if dtype is None else values.astype(dtype)


def dequantized_parameter(blocks: UInt8[np.ndarray, "experts out num_blocks bytes"],
                          scales: UInt8[np.ndarray, "experts out num_blocks"], name: str) -> np.ndarray:
    """The whole parameter [experts, in, out] (bfloat16) of `name`_blocks / `name`_scales (transformers' loader
    transposes the packed [experts, out, in] to the parameter's [experts, in, out], and so does this)."""
    return np.asarray(Mxfp4Parameter(blocks, scales, name))
