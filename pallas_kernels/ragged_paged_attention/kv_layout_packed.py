"""The "packed" TPU KV layout (bfloat16 / float32): its PackedLayout, and packing the interleaved cache into it.

Per layer uint32 words [num_pages, page_size * rows_per_token, 128]. A token is a list of 128-lane *vectors* of the
cache dtype in VectorOrder (vector_order.py). Consecutive vectors share 32-bit words: bfloat16 packs vector 2j in the
low and 2j+1 in the high 16 bits (so with head_dim 128, K_h and V_h share word row h); float32 has one vector per row.
Rows are whole tiles, so no padding: physical bytes == logical bytes (up to an odd head count in bfloat16). Kernels
load a vector with one sublane-strided uint32 load (stride rows_per_token; tpu_kv_reads.py) and split halves with
shifts and bitcasts. Under tensor parallelism a page's rows are shard-major (kv_layout.py says more).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, UInt32

from pallas_kernels.ragged_paged_attention.vector_order import LANES, VectorOrder


@dataclasses.dataclass(frozen=True)
class PackedLayout(VectorOrder):
    """Where each head's K and V sit in a token's uint32 rows (static; hashable)."""

    dtype_name: str

    def __post_init__(self):
        super().__post_init__()
        if self.dtype_name not in ("float32", "bfloat16"):
            raise ValueError(f"dtype: the packed TPU layout holds float32 or bfloat16, got {self.dtype_name}")

    @property
    def dtype(self):
        return jnp.dtype(self.dtype_name)

    @property
    def packing(self) -> int:
        """Vectors per 32-bit word row."""
        return 4 // self.dtype.itemsize

    @property
    def rows_per_token(self) -> int:
        return -(-self.vectors_per_token // self.packing)


def packed_layout_for(num_kv_heads: int, head_dim: int, dtype) -> PackedLayout:
    return PackedLayout(num_kv_heads, head_dim, jnp.dtype(dtype).name)


def _vectors(kv_pages: Float[Array, "num_pages page_size kv_heads_x2 head_dim"], layout: PackedLayout):
    """[num_pages, page_size, vectors_per_token, 128] of the cache dtype, in the packed order."""
    num_pages, page_size, kv_heads_x2, head_dim = kv_pages.shape
    keys, values = kv_pages[:, :, 0::2], kv_pages[:, :, 1::2]
    if layout.combined:
        return jnp.concatenate([keys, values], axis=-1)
    split = lambda x: x.reshape(num_pages, page_size, kv_heads_x2 // 2, 1, layout.lane_tiles, LANES)  # noqa: E731
    return jnp.concatenate([split(keys), split(values)], axis=3).reshape(num_pages, page_size, -1, LANES)


def pack_kv_pages(kv_pages: Float[Array, "num_pages page_size kv_heads_x2 head_dim"], num_shards: int = 1
                  ) -> UInt32[Array, "num_pages rows lanes"]:
    """The interleaved cache in the packed layout of `num_shards` shards (a full copy: for tests, tools and
    migration)."""
    if num_shards > 1:
        return jnp.concatenate([pack_kv_pages(part) for part in jnp.split(kv_pages, num_shards, axis=2)], axis=1)
    num_pages, page_size, kv_heads_x2, head_dim = kv_pages.shape
    layout = packed_layout_for(kv_heads_x2 // 2, head_dim, kv_pages.dtype)
    vectors = _vectors(kv_pages, layout)
    padded = layout.rows_per_token * layout.packing
    vectors = jnp.pad(vectors, ((0, 0), (0, 0), (0, padded - vectors.shape[2]), (0, 0)))
    if layout.packing == 1:
        words = jax.lax.bitcast_convert_type(vectors, jnp.uint32)
    else:
        halves = jax.lax.bitcast_convert_type(vectors, jnp.uint16).astype(jnp.uint32)
        halves = halves.reshape(num_pages, page_size, layout.rows_per_token, 2, LANES)
        words = halves[:, :, :, 0] | (halves[:, :, :, 1] << 16)
    return words.reshape(num_pages, page_size * layout.rows_per_token, LANES)


def unpack_kv_pages(words: UInt32[Array, "num_pages rows lanes"], num_kv_heads: int, head_dim: int,
                    dtype, num_shards: int = 1) -> Float[Array, "num_pages page_size kv_heads_x2 head_dim"]:
    """Inverse of pack_kv_pages."""
    if num_shards > 1:
        return jnp.concatenate([unpack_kv_pages(part, num_kv_heads // num_shards, head_dim, dtype)
                                for part in jnp.split(words, num_shards, axis=1)], axis=2)
    layout = packed_layout_for(num_kv_heads, head_dim, dtype)
    num_pages = words.shape[0]
    page_size = words.shape[1] // layout.rows_per_token
    words = words.reshape(num_pages, page_size, layout.rows_per_token, 1, LANES)
    if layout.packing == 1:
        vectors = jax.lax.bitcast_convert_type(words[:, :, :, 0], layout.dtype)
    else:
        halves = jnp.concatenate([words & 0xFFFF, words >> 16], axis=3).astype(jnp.uint16)
        vectors = jax.lax.bitcast_convert_type(halves, layout.dtype).reshape(num_pages, page_size, -1, LANES)
    vectors = vectors[:, :, :layout.vectors_per_token]
    if layout.combined:
        keys, values = vectors[..., :head_dim], vectors[..., head_dim:]
    else:
        per_head = vectors.reshape(num_pages, page_size, num_kv_heads, 2, head_dim)
        keys, values = per_head[:, :, :, 0], per_head[:, :, :, 1]
    return jnp.stack([keys, values], axis=3).reshape(num_pages, page_size, 2 * num_kv_heads, head_dim)
