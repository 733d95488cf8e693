"""Sizing the paged KV cache: its layout, its element dtype and how many blocks fit the budget (one block's shape and
bytes: kv_spec.py; the pool itself: kv_pool.py)."""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.config import CacheConfig
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.runner.kv_spec import build_kv_spec, logical_bytes_per_token
from pallas_kernels.kv_quantization import quantized_pool_dtype
from pallas_kernels.ragged_paged_attention.kv_layout_packed import packed_layout_for

# On CPU the KV pool shares a 24 GiB machine with the weights, XLA's buffers and the rest of the box.
CPU_DEFAULT_KV_CACHE_BYTES = 1 << 30
# On an accelerator, the share of free device memory the pool takes when no size is given.
ACCELERATOR_KV_CACHE_FRACTION = 0.6


def kv_storage_dtype(dtype, kv_cache_dtype: str = "auto") -> np.dtype:
    """The dtype of the pool's elements: the model dtype, or for a quantized kv_cache_dtype int8 / uint8
    (pallas_kernels/kv_quantization.py)."""
    if kv_cache_dtype == "auto":
        return np.dtype(dtype)
    return np.dtype(quantized_pool_dtype(kv_cache_dtype))


def choose_kv_layout(model: ModelConfig, backend: str, dtype, tensor_parallel_size: int = 1,
                     kv_cache_dtype: str = "auto") -> str:
    """"quantized" for an int8 / fp8 kv_cache_dtype ("packed_quantized" on pallas_tpu: kv_layout_quantized.py,
    ValueError naming kv_cache_dtype for a head_dim it cannot pack); "packed" for the TPU kernel when it can hold these
    heads (tile-exact: no HBM padding); "interleaved_bits" for bfloat16 on the "xla" backend (XLA:CPU scatters into a
    uint16 pool in place, into a bfloat16 one not); else "interleaved".

    Under tensor parallelism every layout is split on its axis -2 (kv_layout.py): the packed one holds each shard's
    heads in its own rows, so it serves every tensor-parallel degree (the interleaved one would pad each shard's
    [2 * kv_heads / tp, head_dim] tile to 16 sublanes on a TPU).
    """
    if kv_cache_dtype != "auto" and backend == "pallas_tpu":
        if model.head_dim != 64 and model.head_dim % 128:
            raise ValueError(f"kv_cache_dtype: {kv_cache_dtype!r} on pallas_tpu packs head_dim 64 or a multiple of "
                             f"128, got {model.head_dim}; use attention_backend='xla' or kv_cache_dtype='auto'")
        return "packed_quantized"
    if kv_cache_dtype != "auto":
        return "quantized"
    if backend == "xla" and jnp.dtype(dtype) == jnp.bfloat16:
        return "interleaved_bits"
    if backend != "pallas_tpu" or model.num_kv_heads % tensor_parallel_size:
        return "interleaved"
    try:
        packed_layout_for(model.num_kv_heads // tensor_parallel_size, model.head_dim, dtype)
    except ValueError:  # a head_dim or dtype the packed layout does not cover
        return "interleaved"
    return "packed"


def bytes_per_block(model: ModelConfig, block_size: int, dtype, platform: Optional[str] = None,
                    layout: str = "interleaved", num_shards: int = 1) -> int:
    """KV bytes one block takes across all layers on each of `num_shards` devices on `platform` (default: jax's
    default backend): the physical bytes of one shard's part, [block_size, 2 * num_kv_heads / num_shards,
    head_dim] interleaved (or quantized) or its packed rows; `dtype`: the pool's (kv_storage_dtype: int8 / uint8 for
    the quantized layout, whose rows carry their scales).

    The tile model of a TPU pads the last two dims of the interleaved shard to whole (8 * packing, 128) tiles (5.3x
    for 3 KV heads of head_dim 64 in bfloat16, 8x for one head per shard in bfloat16): an upper bound, as XLA:TPU
    may store a small shard unpadded (docs/tpu-compile.md). Elsewhere, and in the packed layout, they equal the
    logical bytes, which is what XLA:TPU allocates for the packed pool.
    """
    return build_kv_spec(model, block_size, dtype, layout, num_shards=num_shards,
                         platform=platform).bytes_per_block_per_device


def logical_bytes_per_block(model: ModelConfig, block_size: int, dtype) -> int:
    """KV bytes one block's values (quantized: codes and scales) occupy across all layers, without any tile padding
    (`dtype`: the pool's, kv_storage_dtype)."""
    return block_size * logical_bytes_per_token(model, dtype)


def num_kv_blocks_for(model: ModelConfig, cache: CacheConfig, dtype, num_shards: int = 1,
                      layout: str = "interleaved", pending_weight_bytes: int = 0) -> int:
    """Blocks in the pool (the null block included) from num_kv_blocks, kv_cache_memory or the device default.

    The budget is per device: with the cache split over num_shards devices, each holds its shard of every block.
    `pending_weight_bytes`: weight bytes per device not placed yet (the start-up plan sizes the pool before the
    weights are on the device), taken off the free memory the accelerator default is a fraction of.
    """
    if cache.num_kv_blocks is not None:
        return cache.num_kv_blocks
    block_bytes = bytes_per_block(model, cache.block_size, dtype, layout=layout, num_shards=num_shards)
    return num_kv_blocks_in_budget(cache, block_bytes, pending_weight_bytes)


def num_kv_blocks_in_budget(cache: CacheConfig, block_bytes: int, pending_weight_bytes: int = 0) -> int:
    """num_kv_blocks_for with one block's bytes per device known (KVSpec.bytes_per_block_per_device)."""
    if cache.num_kv_blocks is not None:
        return cache.num_kv_blocks
    budget = cache.kv_cache_memory or _default_budget_bytes(pending_weight_bytes, cache.gpu_memory_utilization)
    num_blocks = budget // block_bytes
    if num_blocks < 2:
        raise ValueError(f"kv_cache_memory: {budget} bytes hold fewer than 2 blocks of {block_bytes} bytes")
    if jax.process_count() > 1:
        # Every process must allocate the same pool (the step's shapes); the tightest host decides.
        from jax.experimental import multihost_utils

        num_blocks = np.min(multihost_utils.process_allgather(np.int64(num_blocks)))
    return int(num_blocks)


def _default_budget_bytes(pending_weight_bytes: int = 0, utilization: Optional[float] = None) -> int:
    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return CPU_DEFAULT_KV_CACHE_BYTES
    stats = device.memory_stats() or {}
    if utilization is not None and stats.get("bytes_limit"):
        return utilization_budget_bytes(stats["bytes_limit"], stats.get("bytes_in_use", 0), pending_weight_bytes,
                                        utilization)
    free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0) - pending_weight_bytes
    return int(free * ACCELERATOR_KV_CACHE_FRACTION) if free > 0 else CPU_DEFAULT_KV_CACHE_BYTES


def utilization_budget_bytes(limit: int, in_use: int, pending_weight_bytes: int, utilization: float) -> int:
    """vLLM's --gpu-memory-utilization as a KV budget: the pool fills the device up to `utilization` of its memory,
    after what is in use and the weights still to be placed; ValueError naming the option when nothing is left."""
    budget = int(limit * utilization) - in_use - pending_weight_bytes
    if budget <= 0:
        raise ValueError(f"gpu_memory_utilization: {utilization} of {limit} bytes leaves no room for the KV cache "
                         f"after {in_use + pending_weight_bytes} bytes of weights and buffers; raise it")
    return budget
