"""YaRN RoPE scaling (Qwen3's 128k recipe, gpt-oss): the config's parameters, the inverse frequencies and the
attention factor, by the YaRN paper's formulas as transformers applies them (its `_compute_yarn_parameters`).

Pairs that turn many times within the original context keep their frequency (extrapolated), slow ones are divided
by `factor` (interpolated), with a linear ramp between; cos and sin are then multiplied by the attention factor, so
q.k grows by its square, making up for the flatter attention of the stretched positions. Host-side: no jax here.
"""

import dataclasses
import math
from typing import Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling, as read from a config's rope_scaling / rope_parameters."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    """Pairs turning more than this many times in the original context are kept as they are."""
    beta_slow: float = 1.0
    """Pairs turning fewer times than this are fully interpolated."""
    attention_factor: Optional[float] = None
    """cos / sin multiplier; None: from factor (and mscale / mscale_all_dim) as the paper suggests."""
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    truncate: bool = True
    """Round the ramp's ends outward to whole pairs (gpt-oss sets False)."""

    def cos_sin_scale(self) -> float:
        """The factor cos and sin are multiplied by."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return _mscale(self.factor, self.mscale) / _mscale(self.factor, self.mscale_all_dim)
        return _mscale(self.factor, 1.0)


def _mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def read_yarn(rope: dict, max_position_embeddings: int) -> YarnScaling:
    """YarnScaling from a rope_scaling dict; a missing factor is max_position_embeddings over the original length
    (as DeepSeek-style configs mean it); KeyError names original_max_position_embeddings when it is missing."""
    original = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor")
    return YarnScaling(
        factor=float(factor) if factor is not None else max_position_embeddings / original,
        original_max_position_embeddings=original,
        beta_fast=float(rope.get("beta_fast") or 32.0), beta_slow=float(rope.get("beta_slow") or 1.0),
        attention_factor=rope.get("attention_factor"), mscale=rope.get("mscale"),
        mscale_all_dim=rope.get("mscale_all_dim"), truncate=bool(rope.get("truncate", True)))


def yarn_inverse_frequencies(head_dim: int, theta: float, scaling: YarnScaling) -> np.ndarray:
    """Per-pair inverse frequencies [head_dim // 2] (float32): extrapolated fast pairs, interpolated slow ones."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    base_freq = (np.float32(1.0) / np.power(np.float32(theta), exponents)).astype(np.float32)

    def pair_of(num_rotations: float) -> float:
        # The (fractional) pair index that turns `num_rotations` times over the original context.
        return head_dim * math.log(scaling.original_max_position_embeddings / (num_rotations * 2 * math.pi)) / (
            2 * math.log(theta))

    low, high = pair_of(scaling.beta_fast), pair_of(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a one-point ramp would divide by zero
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0.0, 1.0)
    keep = (1.0 - ramp).astype(np.float32)  # 1: extrapolate (fast pairs), 0: interpolate (slow pairs)
    return (base_freq / np.float32(scaling.factor) * (1 - keep) + base_freq * keep).astype(np.float32)
