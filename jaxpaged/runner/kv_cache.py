"""Sizing and allocating the paged KV cache: [num_layers, num_blocks, block_size, 2 * num_kv_heads, head_dim]."""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.config import CacheConfig
from jaxpaged.models.model_config import ModelConfig
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape, physical_bytes

# On CPU the KV pool shares a 24 GiB machine with the weights, XLA's buffers and the rest of the box.
CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30
# On an accelerator, the share of free device memory the pool takes when no size is given.
ACCELERATOR_KV_CACHE_FRACTION = 0.6


def bytes_per_block(model: ModelConfig, block_size: int, dtype, platform: Optional[str] = None,
                    layout: str = "interleaved") -> int:
    """KV bytes one block takes across all layers on `platform` (default: jax's default backend).

    Physical bytes: a TPU pads the last two dims of [block_size, 2 * num_kv_heads, head_dim] to whole
    (8 * packing, 128) tiles (5.3x for 3 KV heads of head_dim 64 in bfloat16); elsewhere they equal the logical
    bytes. Sizing the pool by logical bytes would overcommit TPU memory by that factor.
    """
    shape, kv_dtype = cache_shape(1, block_size, model.num_kv_heads, model.head_dim, dtype, layout)
    return model.num_layers * physical_bytes(shape, kv_dtype, platform or jax.default_backend())


def logical_bytes_per_block(model: ModelConfig, block_size: int, dtype) -> int:
    """KV bytes one block's values occupy across all layers, without any tile padding."""
    return model.num_layers * block_size * 2 * model.num_kv_heads * model.head_dim * np.dtype(dtype).itemsize


def describe_kv_bytes(model: ModelConfig, num_blocks: int, block_size: int, dtype, layout: str = "interleaved") -> str:
    """A start-up log line: the pool's logical and physical bytes on this platform."""
    logical = num_blocks * logical_bytes_per_block(model, block_size, dtype)
    physical = num_blocks * bytes_per_block(model, block_size, dtype, layout=layout)
    return (f"KV cache: {num_blocks} blocks, {logical / 2**30:.2f} GiB logical, {physical / 2**30:.2f} GiB physical "
            f"on {jax.default_backend()} ({layout} layout, x{physical / logical:.2f})")


def num_kv_blocks_for(model: ModelConfig, cache: CacheConfig, dtype, num_shards: int = 1) -> int:
    """Blocks in the pool (the null block included) from num_kv_blocks, kv_cache_memory or the device default.

    The budget is per device: with the cache split over num_shards devices, each holds 1/num_shards of a block.
    """
    if cache.num_kv_blocks is not None:
        return cache.num_kv_blocks
    budget = cache.kv_cache_memory or _default_budget_bytes()
    num_blocks = budget * num_shards // bytes_per_block(model, cache.block_size, dtype)
    if num_blocks < 2:
        raise ValueError(f"kv_cache_memory: {budget} bytes hold fewer than 2 blocks of "
                         f"{bytes_per_block(model, cache.block_size, dtype)} bytes")
    if jax.process_count() > 1:
        # Every process must allocate the same pool (the step's shapes); the tightest host decides.
        from jax.experimental import multihost_utils

        num_blocks = np.min(multihost_utils.process_allgather(np.int64(num_blocks)))
    return int(num_blocks)


def _default_budget_bytes() -> int:
    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return CPU_DEFAULT_KV_CACHE_BYTES
    stats = device.memory_stats() or {}
    free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0)
    return int(free * ACCELERATOR_KV_CACHE_FRACTION) if free > 0 else CPU_DEFAULT_KV_CACHE_BYTES


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int, dtype,
                      sharding: Optional[jax.sharding.Sharding] = None) -> jax.Array:
    """A zeroed pool, created in place on its devices (each shard allocates only its part); block 0 is the
    null block that padding writes to."""
    shape = (model.num_layers, num_blocks, block_size, 2 * model.num_kv_heads, model.head_dim)
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)()
