"""The KV tiers as an engine feature: building them for the runners' layout, choosing when a load beats a
recompute (after warm-up), persisting the KV cache at shutdown, and the per-tier stats (the device's included)."""

import logging
import time
from collections.abc import Sequence
from typing import Optional

from jaxpaged.config import EngineConfig
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.engine.ranks import DataParallelRanks
from jaxpaged.engine.stats import EngineStats
from jaxpaged.features.base import EngineFeature
from jaxpaged.kv_tiers import KVTiers, TierStats, layout_fingerprint, weights_sample_digest
from jaxpaged.multihost.runtime import is_multi_process
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.runner.tier_transfer import TIER_TRANSFER_BATCH, min_blocks_worth_loading
from jaxpaged.weights.loader import LoadedModel

logger = logging.getLogger(__name__)


def build_kv_tiers(loaded: LoadedModel, config: EngineConfig, runners: Sequence[ModelRunner]) -> KVTiers:
    """The host and disk tiers for the runners' KV layout, one fingerprint per tensor-parallel shard, attached to
    every runner (data-parallel ranks share them)."""
    if is_multi_process():
        raise ValueError("kv_offload_memory: the KV tiers (kv_offload_memory, kv_offload_dir) run in one process; "
                         "multi-host engines do not support them yet")
    cache = config.cache
    tp = config.tensor_parallel_size
    runner = runners[0]
    kv_spec = runner.plan.kv_spec
    weights = weights_sample_digest(loaded.params)
    # int8 weights compute other K/V than the float checkpoint they came from (params loaded float and quantized by
    # the runner would sample the same digest); unquantized engines keep their fingerprints.
    quantization = loaded.quantization or config.quantization
    dtype = str(runner.dtype) if quantization is None else f"{runner.dtype}, {quantization} weights"
    # With KV cache groups a block's slots hold one group's layers: the groups join the fingerprint.
    kv_groups = (tuple((group.sliding_window, group.layer_ids) for group in kv_spec.groups)
                 if any(window is not None for window in kv_spec.group_windows) else ())
    fingerprints = [layout_fingerprint(loaded.name, loaded.hf_config, dtype, cache.block_size,
                                       kv_spec.layout, kv_spec.tier_block_shape, tp, shard, weights,
                                       cache.kv_cache_dtype, kv_groups)
                    for shard in range(tp)]
    block_spec = (str(kv_spec.pool_dtype), kv_spec.tier_block_shape)
    mac_key = cache.kv_offload_key.encode() if cache.kv_offload_key is not None else None
    tiers = KVTiers(fingerprints, cache.kv_offload_memory, cache.kv_offload_dir, cache.kv_offload_dir_max_bytes,
                    block_spec, mac_key)
    for each in runners:
        each.attach_kv_tiers(tiers)
    return tiers


def choose_min_load_blocks(configured: Optional[int], runner: ModelRunner, schedulers: Sequence[Scheduler],
                           max_model_len: int) -> int:
    """The shortest lower-tier hit worth loading, set on every scheduler: `configured`, or the fewest blocks whose
    load (measured in whole batches) beats recomputing their tokens (measured on the largest bucket's step)."""
    block_size = runner.block_size
    if configured is None:
        load_seconds, token_seconds = runner.measure_load_and_prefill_seconds()
        configured = min_blocks_worth_loading(load_seconds, token_seconds, block_size,
                                              -(-max_model_len // block_size))
        logger.info("KV tiers: a batch of %d blocks loads in %.2f ms; recomputing takes %.1f us per token: "
                    "hits of %d+ blocks are loaded", TIER_TRANSFER_BATCH, load_seconds * 1e3, token_seconds * 1e6,
                    configured)
    for scheduler in schedulers:
        scheduler.kv_cache_manager.min_load_blocks = configured
    return configured


def persist_kv_cache(tiers: KVTiers, runners: Sequence[ModelRunner], schedulers: Sequence[Scheduler],
                     deadline: Optional[float] = None) -> int:
    """Write what host memory and the device pools cache to the disk tier, coldest first, so the next engine on
    the directory starts warm (the disk's bound still holds: when it is full, the hottest blocks win); returns
    how many blocks were written.

    With a `deadline` (time.monotonic()) it stops there, between batches of TIER_TRANSFER_BATCH blocks, and logs
    a warning with how many blocks were written and how many were not: a shutdown that runs out of time leaves
    the disk tier consistent (each block is its own file) and says so, instead of being killed mid-write unseen.
    """
    start = time.monotonic()
    num_written, num_left = tiers.flush_host_to_disk(deadline)
    for scheduler, runner in zip(schedulers, runners):
        manager = scheduler.kv_cache_manager
        saves = [(block_id, block_hash) for block_id, block_hash in manager.blocks_worth_persisting()
                 if not tiers.on_disk(block_hash)]
        for _, block_hash in saves:
            manager.hand_down_record(block_hash)  # for the disk's KV events (when on)
        transfer = runner.tier_transfer
        assert transfer is not None  # attached by build_kv_tiers
        for begin in range(0, len(saves), TIER_TRANSFER_BATCH):
            if deadline is not None and time.monotonic() >= deadline:
                num_left += len(saves) - begin
                break
            batch = saves[begin:begin + TIER_TRANSFER_BATCH]
            transfer.finish_saves(transfer.start_saves(runner.kv_cache, batch), straight_to_disk=True)
            num_written += len(batch)
    elapsed = time.monotonic() - start
    if num_left:
        logger.warning("KV tiers: %d blocks persisted to disk in %.2f s; %d cached blocks NOT persisted: the "
                       "shutdown's time for it ran out (--kv-persist-timeout)", num_written, elapsed, num_left)
    else:
        logger.info("KV tiers: %d blocks persisted to disk in %.2f s", num_written, elapsed)
    return num_written


def tier_stats(tiers: KVTiers, runners: Sequence[ModelRunner], schedulers: Sequence[Scheduler],
               prefix_cache_hits: int, device_usage: float) -> dict[str, TierStats]:
    """Per tier, the device first: its hits are the prefix-cache hits the tiers below did not serve (token-granular
    copies included), its bytes the pools' (over every device of every rank); its bytes_out are what it offloaded
    to the tiers below, its bytes_in what it loaded from them."""
    lower = tiers.stats()
    block_size = runners[0].block_size
    for name, stats in lower.items():
        stats.hit_tokens = tiers.hit_chain_blocks[name] * block_size
    capacity = sum((runner.num_kv_blocks - 1) * runner.memory_plan.kv_bytes_per_block_per_device
                   * runner.mesh.devices.size for runner in runners)
    device = TierStats(hit_tokens=prefix_cache_hits - sum(stats.hit_tokens for stats in lower.values()),
                       bytes_in=tiers.bytes_loaded, bytes_out=tiers.bytes_offloaded,
                       bytes_used=int(device_usage * capacity), capacity_bytes=capacity,
                       num_blocks=sum(s.kv_cache_manager.block_pool.num_cached_blocks for s in schedulers))
    return {"device": device, **lower}


class KVTierFeature(EngineFeature):
    """Host and disk tiers below the device pools, shared by the data-parallel ranks."""

    def __init__(self, tiers: KVTiers, min_load_blocks: Optional[int], max_model_len: int) -> None:
        self.tiers = tiers
        self._min_load_blocks = min_load_blocks
        self._max_model_len = max_model_len

    def after_warmup(self, ranks: DataParallelRanks) -> None:
        choose_min_load_blocks(self._min_load_blocks, ranks.runners[0], ranks.schedulers, self._max_model_len)

    def on_reset(self) -> None:
        self.tiers.clear_host()  # the disk tier persists: that is what it is for

    def add_stats(self, stats: EngineStats, ranks: DataParallelRanks) -> None:
        stats.kv_tiers = tier_stats(self.tiers, ranks.runners, ranks.schedulers, stats.prefix_cache_hits,
                                    stats.kv_cache_usage)

    def close(self, ranks: DataParallelRanks, deadline: Optional[float] = None) -> None:
        if self.tiers.has_disk:
            persist_kv_cache(self.tiers, ranks.runners, ranks.schedulers, deadline)
