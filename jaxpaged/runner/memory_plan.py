"""The start-up memory plan of one rank: weights and KV cache per device, checked before anything is placed or
compiled, so a configuration that cannot work fails naming the option to change instead of with an XLA
out-of-memory error half-way through warm-up."""

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from jaxpaged.core.kv_cache_groups import max_sequence_tokens, sequence_blocks
from jaxpaged.models.int8_weights import stored_dtype
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.kv_spec import KVSpec, build_kv_spec
from jaxpaged.runner.zero_padded import HostWeight
from pallas_kernels.kv_quantization import SCALE_DTYPE, format_of_pool, is_quantized_pool

logger = logging.getLogger(__name__)

WEIGHT_SHARE_LIMIT = 0.9
"""Weights may take at most this share of a device's memory: the KV cache and XLA's buffers need the rest."""


def weight_bytes_per_device(params: Mapping[str, HostWeight], model: ModelConfig, tp: int, dtype) -> int:
    """Bytes of the weights on each device of a rank as they will be stored (the engine dtype; int8 projections and
    their float32 scales as such), after tensor-parallel sharding (and the experts' split over data-parallel ranks in
    lock step)."""
    total = 0
    for name, value in params.items():
        spec = mesh_lib.param_partition_spec(name, value.shape, model, tp)
        shards = 1
        for entry in spec:  # an axis split over one mesh axis, or over ("data", "model") (experts in lock step)
            for axis in entry if isinstance(entry, tuple) else (entry,):
                shards *= {mesh_lib.MODEL_AXIS: tp, mesh_lib.DATA_AXIS: getattr(model, "expert_data_parallel", 1)
                           }.get(axis, 1)
        total += int(np.prod(value.shape)) // shards * stored_dtype(name, value.dtype, dtype).itemsize
    return total


def device_memory_bytes(device: Any) -> Optional[int]:
    """The memory one accelerator offers (its allocator's limit); None on CPU, where the host's RAM is the limit."""
    if device.platform == "cpu":
        return None
    stats = device.memory_stats() or {}
    return stats.get("bytes_limit") or None


def check_weights_fit(weight_bytes: int, device_bytes: Optional[int], tp: int, dtype) -> None:
    """ValueError naming tensor_parallel_size / dtype when the weights alone would not fit one device."""
    if device_bytes is None or weight_bytes <= WEIGHT_SHARE_LIMIT * device_bytes:
        return
    needed_tp = tp
    while weight_bytes * tp / needed_tp > WEIGHT_SHARE_LIMIT * device_bytes:
        needed_tp *= 2
    raise ValueError(f"tensor_parallel_size: the weights take {weight_bytes / 2**30:.2f} GiB per device at "
                     f"tensor_parallel_size={tp} in {np.dtype(dtype).name}, over {WEIGHT_SHARE_LIMIT:.0%} of a "
                     f"device's {device_bytes / 2**30:.2f} GiB; use tensor_parallel_size >= {needed_tp} (or a "
                     f"smaller dtype)")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """What one rank will hold per device, and how many full-length sequences its KV pool can carry."""

    weight_bytes_per_device: int
    kv_bytes_per_token: int
    """Logical K and V bytes of one token over all layers and kv heads (the whole model, before any split)."""
    kv_bytes_per_block_per_device: int
    """Physical bytes of one block on one device (TPU tile padding included)."""
    num_kv_blocks: int
    """Blocks in the pool, the null block included."""
    block_size: int
    max_model_len: int
    layout: str = "interleaved"
    """The KV cache layout (kv_layout.py)."""
    physical_over_logical: float = 1.0
    """Bytes a block occupies over the bytes of its values: TPU tile padding of the layout (1.0 elsewhere)."""
    weight_format: str = ""
    """How the weights are stored ("float32", "int8 projections + bfloat16"); "" when not said."""
    kv_format: str = ""
    """How K and V are stored ("bfloat16", "int8 + a bfloat16 scale per token per head": kv_format); "" when not
    said."""
    group_windows: tuple[Optional[int], ...] = (None,)
    """Per KV layer group (runner/kv_spec.py): its sliding window, None for full attention. A block id serves every
    group, so a sequence holds blocks in each."""
    max_chunk_tokens: int = 1
    """Most tokens one step computes for a sequence (max_num_batched_tokens): a sliding group holds a step's blocks
    beside its window, which check() counts as the scheduler does."""

    @property
    def blocks_per_max_len_sequence(self) -> int:
        """Blocks a decoding sequence of max_model_len tokens holds over every group: all of its tokens' in a full
        group, in a sliding group those its window reaches (ceil((w - 1) / block_size) + 1, vLLM's count)."""
        return sequence_blocks(self.max_model_len, self.block_size, self.group_windows)

    @property
    def max_sequences_at_max_model_len(self) -> int:
        """How many sequences of max_model_len tokens fit the pool at once (block 0 is never handed out)."""
        return (self.num_kv_blocks - 1) // self.blocks_per_max_len_sequence

    def describe(self) -> str:
        kv_per_device = self.num_kv_blocks * self.kv_bytes_per_block_per_device
        weight_format = f" ({self.weight_format})" if self.weight_format else ""
        kv_format = f" in {self.kv_format}" if self.kv_format else ""
        return (f"memory plan per device: weights {self.weight_bytes_per_device / 2**20:.1f} MiB{weight_format}; KV "
                f"{self.kv_bytes_per_token / 2**10:.2f} KiB per token{kv_format} (all devices), "
                f"{self.kv_bytes_per_block_per_device / 2**10:.1f} KiB per {self.block_size}-token block, "
                f"{self.num_kv_blocks} blocks = {kv_per_device / 2**20:.1f} MiB ({self.layout} layout, physical "
                f"x{self.physical_over_logical:.2f} of logical); "
                f"{self.max_sequences_at_max_model_len} sequences of max_model_len={self.max_model_len} fit at once"
                f"{self._describe_groups()}")

    def _describe_groups(self) -> str:
        """The KV cache groups, when there are several (or one sliding group)."""
        if self.group_windows == (None,):
            return ""
        kinds = ", ".join("full" if window is None else f"window {window}" for window in self.group_windows)
        return f" ({len(self.group_windows)} KV cache groups: {kinds})"

    def check(self) -> None:
        """ValueError naming the options when not even one max_model_len sequence fits the pool (as vLLM does;
        with sliding groups, while a step of max_chunk_tokens runs)."""
        needed = sequence_blocks(self.max_model_len, self.block_size, self.group_windows, self.max_chunk_tokens)
        if needed <= self.num_kv_blocks - 1:
            return
        fitted = max_sequence_tokens(self.num_kv_blocks - 1, self.block_size, self.group_windows,
                                     self.max_chunk_tokens, self.max_model_len)
        usable_tokens = fitted // self.block_size * self.block_size
        needed_blocks = needed + 1
        raise ValueError(
            f"max_model_len: {self.max_model_len} tokens need {needed} KV blocks but the "
            f"pool has {self.num_kv_blocks - 1} usable ({usable_tokens} tokens); lower max_model_len to "
            f"<= {usable_tokens}, or raise num_kv_blocks to >= {needed_blocks} (kv_cache_memory to >= "
            f"{needed_blocks * self.kv_bytes_per_block_per_device} bytes per device)")


def fit_max_model_len(context_len: int, num_kv_blocks: int, block_size: int,
                      group_windows: tuple[Optional[int], ...] = (None,), max_chunk_tokens: int = 1) -> int:
    """The default max_model_len: the model's context length, or what the pool holds (block 0 aside) when one
    sequence of it does not fit, with the reason logged. With KV cache groups a sequence holds blocks in every group
    (a sliding group its window's and a step's of max_chunk_tokens), as the scheduler counts them."""
    fitted = max_sequence_tokens(num_kv_blocks - 1, block_size, group_windows, max_chunk_tokens, context_len)
    if fitted == context_len:
        return context_len
    usable_tokens = fitted // block_size * block_size
    logger.warning("max_model_len: %d (the model's context length) lowered to %d, the tokens the KV pool of %d "
                   "blocks holds for one sequence; raise kv_cache_memory or num_kv_blocks to serve the whole context",
                   context_len, usable_tokens, num_kv_blocks)
    return usable_tokens


def weight_format(params: Mapping[str, HostWeight], dtype) -> str:
    """How the weights will be stored, for the plan's log line: the engine dtype, or int8 projections beside it."""
    name = np.dtype(dtype).name
    return f"int8 projections + {name}" if any(value.dtype == np.int8 for value in params.values()) else name


def kv_format(kv_storage_dtype) -> str:
    """How K and V are stored, for the plan's log line: the model dtype, or the quantized format and its scales."""
    if is_quantized_pool(kv_storage_dtype):
        return f"{format_of_pool(kv_storage_dtype)} + a {SCALE_DTYPE.name} scale per token per head"
    return np.dtype(kv_storage_dtype).name


def plan_memory(model: ModelConfig, weight_bytes: int, num_kv_blocks: int, block_size: int, max_model_len: int,
                dtype, tp: int, layout: str, weight_format: str = "", platform: Optional[str] = None,
                hybrid: bool = True) -> MemoryPlan:
    """The plan of a rank whose KV cache is split over tp devices by heads (`dtype`: the KV pool's,
    runner/kv_cache.py kv_storage_dtype; `weight_format`: see MemoryPlan; `platform`: whose tiling sizes the blocks,
    jax's default backend when None; `hybrid`: KV cache groups for sliding-window layers)."""
    spec = build_kv_spec(model, block_size, dtype, layout, num_shards=tp, platform=platform, hybrid=hybrid)
    return memory_plan_for(spec, weight_bytes, num_kv_blocks, max_model_len, weight_format)


def memory_plan_for(spec: KVSpec, weight_bytes: int, num_kv_blocks: int, max_model_len: int,
                    weight_format: str = "", max_chunk_tokens: int = 1) -> MemoryPlan:
    """The plan of a rank whose KV blocks are `spec`'s (the start-up plan's, sized once)."""
    per_device, per_token = spec.bytes_per_block_per_device, spec.logical_bytes_per_token
    return MemoryPlan(weight_bytes, per_token, per_device, num_kv_blocks, spec.block_size, max_model_len, spec.layout,
                      per_device * spec.num_shards * spec.num_model_layers
                      / (per_token * spec.block_size * spec.num_layer_slots), weight_format,
                      kv_format(spec.storage_dtype), spec.group_windows, max_chunk_tokens)
