"""KVSpec: what one KV block is, decided once at start-up (StartupPlan.kv_spec) and read by everything that sizes,
allocates, copies or moves the pool: the memory plan, the KV pool, the tier transfers and the tiers' fingerprint.

A block spans every layer. The layers fall into groups that share a page shape and an attention kind; today there is
one group of all layers with full attention. A model with sliding-window layers would add a group of its own (its
pages shaped alike, its admission counted per group by the scheduler), which is why the pool's shape is read per
group here and not from the model's layer count.
"""

import dataclasses
from typing import Optional

import jax
import numpy as np

from jaxpaged.models.model_config import ModelConfig
from pallas_kernels.kv_quantization import pool_row_width
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape, physical_bytes


@dataclasses.dataclass(frozen=True)
class KVLayerGroup:
    """Layers whose pages share one shape and one attention kind: one array of the pool."""

    layer_ids: tuple[int, ...]
    """The model's layers in this group, in order (the array's axis 0)."""
    page_shape: tuple[int, ...]
    """One layer's page of one block, every tensor-parallel shard together (kv_layout.py cache_shape)."""
    shard_page_shape: tuple[int, ...]
    """The part of page_shape one tensor-parallel shard stores (split on axis -2)."""
    page_dtype: np.dtype
    """The array's element dtype (uint16 bits, uint32 words, int8 / uint8 codes or the model dtype)."""
    attention: str = "full"
    """"full": every earlier token is attended (the only kind today; a sliding window would be its own group)."""
    sliding_window: Optional[int] = None
    """Tokens a sliding-window group attends back; None for full attention."""

    @property
    def num_layers(self) -> int:
        """Layers stacked on the group's axis 0."""
        return len(self.layer_ids)


@dataclasses.dataclass(frozen=True)
class KVSpec:
    """One KV block: layout, dtypes, page size, bytes, and the shape of every layer group."""

    layout: str
    """The pool's layout (kernels/ragged_paged_attention/kv_layout.py)."""
    storage_dtype: np.dtype
    """What K and V are stored as: the model dtype, or int8 / uint8 codes for a quantized kv_cache_dtype."""
    kv_cache_dtype: str
    """config.cache.kv_cache_dtype as planned: "auto", "int8" or "fp8_e4m3"."""
    block_size: int
    """Tokens per block (a page, to the kernels)."""
    num_shards: int
    """Tensor-parallel shards the pool is split over (by KV heads)."""
    bytes_per_block_per_device: int
    """Physical bytes of one block, every layer, on one device (TPU tile padding included)."""
    logical_bytes_per_token: int
    """K and V bytes of one token over every layer and KV head, without padding (the whole model, all shards)."""
    groups: tuple[KVLayerGroup, ...]
    """The layer groups; today one group of all layers with full attention."""

    @property
    def group(self) -> KVLayerGroup:
        """The only layer group (every reader today assumes one; a second group needs them all revisited)."""
        assert len(self.groups) == 1, "several KV layer groups are not served yet"
        return self.groups[0]

    def pool_shape(self, num_blocks: int) -> tuple[int, ...]:
        """The pool array's shape: [layers, num_blocks, *page] (axis 1 is the block axis in every layout)."""
        group = self.group
        return (group.num_layers, num_blocks, *group.page_shape)

    @property
    def pool_dtype(self) -> np.dtype:
        """The pool array's element dtype."""
        return self.group.page_dtype

    @property
    def tier_block_shape(self) -> tuple[int, ...]:
        """One block as one tensor-parallel shard stores it below the device: [layers, *shard page]."""
        group = self.group
        return (group.num_layers, *group.shard_page_shape)


def build_kv_spec(model: ModelConfig, block_size: int, storage_dtype, layout: str, kv_cache_dtype: str = "auto",
                  num_shards: int = 1, platform: Optional[str] = None) -> KVSpec:
    """The spec of a pool of `model`'s layers in `layout` over `num_shards` devices (`storage_dtype`: runner/kv_cache.py
    kv_storage_dtype; `platform`: whose tiling sizes the block, jax's default backend when None); ValueError naming
    num_shards when it does not divide the KV heads."""
    if num_shards < 1 or model.num_kv_heads % num_shards:
        raise ValueError(f"num_shards: must divide num_kv_heads ({model.num_kv_heads}), got {num_shards}")
    whole, page_dtype = cache_shape(1, block_size, model.num_kv_heads, model.head_dim, storage_dtype, layout,
                                    num_shards)
    shard, _ = cache_shape(1, block_size, model.num_kv_heads // num_shards, model.head_dim, storage_dtype, layout)
    group = KVLayerGroup(tuple(range(model.num_layers)), tuple(whole[1:]), tuple(shard[1:]), np.dtype(page_dtype))
    per_device = group.num_layers * physical_bytes(shard, page_dtype, platform or jax.default_backend())
    return KVSpec(layout, np.dtype(storage_dtype), kv_cache_dtype, block_size, num_shards, per_device,
                  logical_bytes_per_token(model, storage_dtype), (group,))


def logical_bytes_per_token(model: ModelConfig, storage_dtype) -> int:
    """K and V bytes of one token's values (quantized: codes and scales) over every layer and KV head."""
    row = pool_row_width(model.head_dim, storage_dtype)
    return model.num_layers * 2 * model.num_kv_heads * row * np.dtype(storage_dtype).itemsize
