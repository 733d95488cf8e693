"""Sizing and allocating the paged KV cache: [num_layers, num_blocks, block_size, 2 * num_kv_heads, head_dim]."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.config import CacheConfig
from jaxpaged.models.model_config import ModelConfig

# On CPU the KV pool shares a 24 GiB machine with the weights, XLA's buffers and the rest of the box.
CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30
# On an accelerator, the share of free device memory the pool takes when no size is given.
ACCELERATOR_KV_CACHE_FRACTION = 0.6


def bytes_per_block(model: ModelConfig, block_size: int, dtype) -> int:
    """KV bytes one block holds across all layers."""
    return model.num_layers * block_size * 2 * model.num_kv_heads * model.head_dim * np.dtype(dtype).itemsize


def num_kv_blocks_for(model: ModelConfig, cache: CacheConfig, dtype) -> int:
    """Blocks in the pool (the null block included) from num_kv_blocks, kv_cache_memory or the device default."""
    if cache.num_kv_blocks is not None:
        return cache.num_kv_blocks
    budget = cache.kv_cache_memory or _default_budget_bytes()
    num_blocks = budget // bytes_per_block(model, cache.block_size, dtype)
    if num_blocks < 2:
        raise ValueError(f"kv_cache_memory: {budget} bytes hold fewer than 2 blocks of "
                         f"{bytes_per_block(model, cache.block_size, dtype)} bytes")
    return int(num_blocks)


def _default_budget_bytes() -> int:
    device = jax.devices()[0]
    if device.platform == "cpu":
        return CPU_DEFAULT_KV_CACHE_BYTES
    stats = device.memory_stats() or {}
    free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0)
    return int(free * ACCELERATOR_KV_CACHE_FRACTION) if free > 0 else CPU_DEFAULT_KV_CACHE_BYTES


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int, dtype) -> jax.Array:
    """A zeroed pool; block 0 is the null block that padding writes to."""
    shape = (model.num_layers, num_blocks, block_size, 2 * model.num_kv_heads, model.head_dim)
    return jnp.zeros(shape, dtype)
