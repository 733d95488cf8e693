"""KVSpec: what one KV block is, decided once at start-up (StartupPlan.kv_spec) and read by everything that sizes,
allocates, copies or moves the pool: the memory plan, the KV pool, the tier transfers and the tiers' fingerprint.

The layers fall into groups of one attention kind (full, or a sliding window w), every group of the same number of
layers (vLLM's hybrid KV cache manager): the larger kind is split into several groups of the smaller kind's size, the
last one padded. One pool array [layers_per_group, num_blocks, *page] then serves every group: layer l of group g keeps
its K/V at slot(l) * num_blocks + block_id, and one block pool hands out block ids to every group, each request
holding a block table per group. A sliding group keeps only the blocks inside its window, so a block costs
layers_per_group pages, not num_layers. A model without windows (or with groups turned off) has one group of every
layer: the pool of before.
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
    """"full": every earlier token is attended; "sliding": the last sliding_window tokens only."""
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
    """The layer groups: one of every layer with full attention for a model without windows."""
    layers_per_group: int = 0
    """Layer slots of every group (the pool's axis 0); 0: the one group's layer count."""

    @property
    def group(self) -> KVLayerGroup:
        """The first layer group (every group's pages share its shape and dtype)."""
        return self.groups[0]

    @property
    def num_groups(self) -> int:
        """Block tables a request holds."""
        return len(self.groups)

    @property
    def num_layer_slots(self) -> int:
        """Layers one block id spans in the pool (the pool's axis 0)."""
        return self.layers_per_group or self.groups[0].num_layers

    @property
    def num_model_layers(self) -> int:
        """The model's layers, over every group."""
        return sum(group.num_layers for group in self.groups)

    @property
    def group_windows(self) -> tuple[Optional[int], ...]:
        """Per group: the sliding window its blocks are kept for, None for full attention (what the scheduler's
        block allocation reads)."""
        return tuple(group.sliding_window for group in self.groups)

    @property
    def layer_placement(self) -> tuple[tuple[int, int], ...]:
        """Per model layer: (its group, its slot in the pool's axis 0)."""
        placement = {layer: (index, slot) for index, group in enumerate(self.groups)
                     for slot, layer in enumerate(group.layer_ids)}
        return tuple(placement[layer] for layer in sorted(placement))

    def pool_shape(self, num_blocks: int) -> tuple[int, ...]:
        """The pool array's shape: [layer slots, num_blocks, *page] (axis 1 is the block axis in every layout)."""
        return (self.num_layer_slots, num_blocks, *self.group.page_shape)

    @property
    def pool_dtype(self) -> np.dtype:
        """The pool array's element dtype."""
        return self.group.page_dtype

    @property
    def tier_block_shape(self) -> tuple[int, ...]:
        """One block as one tensor-parallel shard stores it below the device: [layers, *shard page]."""
        return (self.num_layer_slots, *self.group.shard_page_shape)


def build_kv_spec(model: ModelConfig, block_size: int, storage_dtype, layout: str, kv_cache_dtype: str = "auto",
                  num_shards: int = 1, platform: Optional[str] = None, hybrid: bool = True) -> KVSpec:
    """The spec of a pool of `model`'s layers in `layout` over `num_shards` devices (`storage_dtype`: runner/kv_cache.py
    kv_storage_dtype; `platform`: whose tiling sizes the block, jax's default backend when None; `hybrid`: group the
    layers by attention kind, else one full-attention group of every layer); ValueError naming num_shards when it
    does not divide the KV heads."""
    if num_shards < 1 or model.num_kv_heads % num_shards:
        raise ValueError(f"num_shards: must divide num_kv_heads ({model.num_kv_heads}), got {num_shards}")
    whole, page_dtype = cache_shape(1, block_size, model.num_kv_heads, model.head_dim, storage_dtype, layout,
                                    num_shards)
    shard, _ = cache_shape(1, block_size, model.num_kv_heads // num_shards, model.head_dim, storage_dtype, layout)
    page = (tuple(whole[1:]), tuple(shard[1:]), np.dtype(page_dtype))
    kinds = layer_groups(layer_windows(model)) if hybrid else [(None, tuple(range(model.num_layers)))]
    groups = tuple(KVLayerGroup(layers, *page, "full" if window is None else "sliding", window)
                   for window, layers in kinds)
    slots = max(group.num_layers for group in groups)
    per_device = slots * physical_bytes(shard, page_dtype, platform or jax.default_backend())
    return KVSpec(layout, np.dtype(storage_dtype), kv_cache_dtype, block_size, num_shards, per_device,
                  logical_bytes_per_token(model, storage_dtype), groups, slots if len(groups) > 1 else 0)


def layer_windows(model: ModelConfig) -> tuple[Optional[int], ...]:
    """Per layer: the sliding window it attends within, None for full attention (a model's sliding_window applies to
    the layers layer_is_sliding marks, or to every layer when it marks none)."""
    window = model.sliding_window
    if window is None:
        return (None,) * model.num_layers
    if not model.layer_is_sliding:
        return (window,) * model.num_layers
    return tuple(window if sliding else None for sliding in model.layer_is_sliding)


def layer_groups(windows: tuple[Optional[int], ...]) -> list[tuple[Optional[int], tuple[int, ...]]]:
    """(window, layer ids) of each group: layers of one kind (full first, then each window), in runs of the smallest
    kind's layer count (vLLM's rule, so one pool's block serves every group); a kind's last run may be shorter."""
    kinds: dict[Optional[int], list[int]] = {}
    for layer, window in sorted(enumerate(windows), key=lambda item: (item[1] is not None, item[1] or 0, item[0])):
        kinds.setdefault(window, []).append(layer)
    size = min(len(layers) for layers in kinds.values())
    return [(window, tuple(layers[start:start + size])) for window, layers in kinds.items()
            for start in range(0, len(layers), size)]


def logical_bytes_per_token(model: ModelConfig, storage_dtype) -> int:
    """K and V bytes of one token's values (quantized: codes and scales) over every layer and KV head."""
    row = pool_row_width(model.head_dim, storage_dtype)
    return model.num_layers * 2 * model.num_kv_heads * row * np.dtype(storage_dtype).itemsize
