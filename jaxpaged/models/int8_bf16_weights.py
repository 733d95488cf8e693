"""Weight-only int8 projections for the native bfloat16-dot matmul (kernels/cpu_native/int8_bf16_matmul.py): the
start-up plan's "bf16 panels" (runner/int8_probe.py), on CPUs with AVX512-BF16.

The int8 values are packed once at load into panels in VDPBF16PS's pair order; the kernel widens them to bfloat16
(exactly) and multiplies them by the inputs rounded to bfloat16, with float32 sums and the column scales on the
result. Against the float32-input int8 paths ("panels", XLA's dot) only the inputs' rounding differs: 8 significant
bits instead of 24, as in a bfloat16 model's matmuls.
"""

from typing import NamedTuple

from jaxtyping import Array, Float32, Int8


class Int8Bf16Weight(NamedTuple):
    """An int8 projection packed for the native bfloat16-dot matmul: panels and per-column float32 scales."""

    panels: Int8[Array, "panels inner_even 16"]
    """W / scale, rounded, as int8_bf16_matmul.pack_int8_pairs packs it."""
    scale: Float32[Array, " outer"]
    """One scale per output column."""
