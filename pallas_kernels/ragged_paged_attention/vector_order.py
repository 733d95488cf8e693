"""The lane width and a token's vector order, shared by both packed TPU layouts (kv_layout_packed.py and
kv_layout_quantized.py): the leaf both import, so neither imports the other."""

import dataclasses

LANES = 128
"""Lanes of a TPU vector register: every packed layout's rows are this wide."""


@dataclasses.dataclass(frozen=True)
class VectorOrder:
    """A token's 128-lane vectors in both packed TPU layouts (the bfloat16 / float32 "packed" one and the
    "packed_quantized" one): for head_dim 64, vector h = [K_h | V_h]; else K_h's lane tiles, then V_h's."""

    num_kv_heads: int
    head_dim: int

    def __post_init__(self):
        if self.head_dim != 64 and self.head_dim % LANES:
            raise ValueError(f"head_dim: the packed TPU layouts need 64 or a multiple of 128, got {self.head_dim}")

    @property
    def combined(self) -> bool:
        """head_dim 64: K_h and V_h side by side in one vector (q is zero-padded to 128 lanes)."""
        return self.head_dim == 64

    @property
    def lane_tiles(self) -> int:
        return 1 if self.combined else self.head_dim // LANES

    @property
    def vectors_per_token(self) -> int:
        return self.num_kv_heads * (1 if self.combined else 2 * self.lane_tiles)

    def key_vectors(self, head: int) -> list[int]:
        """Vector indices holding K of `head` (for combined: its [K | V] vector)."""
        if self.combined:
            return [head]
        return [2 * head * self.lane_tiles + t for t in range(self.lane_tiles)]

    def value_vectors(self, head: int) -> list[int]:
        if self.combined:
            return [head]
        return [(2 * head + 1) * self.lane_tiles + t for t in range(self.lane_tiles)]
