"""Moving KV blocks between the device pool and the host tiers: batched gathers down, batched scatters up.

Every transfer is one fixed-size batch of TIER_TRANSFER_BATCH blocks with all their layers (one executable each
way, compiled at warm-up; padding rows read or write the null block 0), never one transfer per block per layer.
Under tensor parallelism the batch keeps the pool's sharding, so each device sends (or receives) only its own
shard: the host tier stores shards separately (kv_tiers/tiers.py).

Order within a step (ModelRunner.forward, through KVPool.start_tier_transfers): gather the evicted blocks
(dispatched first, so they read the pool before anything overwrites it), scatter the loaded ones, then block copies
and the step; the gathered bytes are pulled to the host while the step runs.
"""

import dataclasses
import functools
import statistics
import time
from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, Shaped

from jaxpaged.kv_tiers.tiers import BlockPayload, KVTiers
from jaxpaged.runner.kv_spec import KVSpec

TIER_TRANSFER_BATCH = 16
"""Blocks per gather or scatter call."""


def gather_blocks(kv_cache: Shaped[Array, "layers blocks *page"],
                  block_ids: Int[Array, " batch"]) -> Shaped[Array, "batch layers *page"]:
    """The listed blocks' K/V, every layer, block-major (axis 1 is the block axis in every KV layout)."""
    return jnp.moveaxis(kv_cache[:, block_ids], 1, 0)


def scatter_blocks(kv_cache: Shaped[Array, "layers blocks *page"], block_ids: Int[Array, " batch"],
                   blocks: Shaped[Array, "batch layers *page"]) -> Shaped[Array, "layers blocks *page"]:
    """kv_cache with blocks[i] written into block block_ids[i], every layer."""
    return kv_cache.at[:, block_ids].set(jnp.moveaxis(blocks, 0, 1))


@dataclasses.dataclass
class PendingSaves:
    """Gathers dispatched to the device, whose results go to the tiers once they reach the host."""

    batches: list[tuple[list[bytes], jax.Array]]


class TierTransfer:
    """One rank's transfers between its KV pool and the shared KVTiers."""

    def __init__(self, kv_cache: jax.Array, spec: KVSpec, tiers: KVTiers) -> None:
        """`kv_cache`: the pool (its sharding, and the example the transfers compile against); `spec`: its blocks."""
        self.tiers = tiers
        sharding = kv_cache.sharding
        assert isinstance(sharding, jax.sharding.NamedSharding)  # the runner places the pool with one
        group = spec.group
        self._batch_shape = (TIER_TRANSFER_BATCH, group.num_layers, *group.page_shape)
        self._dtype = group.page_dtype
        # [batch, layers, *page] keeps the pool's axes after the first two, so the pool's spec shards it alike.
        self._batch_sharding = sharding
        replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
        self._ids_sharding = replicated
        example_ids = jax.ShapeDtypeStruct((TIER_TRANSFER_BATCH,), jnp.int32, sharding=replicated)
        example_batch = jax.ShapeDtypeStruct(self._batch_shape, self._dtype, sharding=sharding)
        self._gather = jax.jit(gather_blocks, out_shardings=sharding).lower(kv_cache, example_ids).compile()
        self._scatter = jax.jit(scatter_blocks, donate_argnums=(0,), out_shardings=sharding).lower(
            kv_cache, example_ids, example_batch).compile()
        # Which tier shard each device's slice of a batch is: its offset along the one sharded axis, if any.
        index_map = sharding.addressable_devices_indices_map(self._batch_shape)
        self._shard_of_device = {device: _shard_number(index, self._batch_shape, tiers.num_shards)
                                 for device, index in index_map.items()}

    def start_saves(self, kv_cache: jax.Array, saves: Sequence[tuple[int, bytes]]) -> PendingSaves:
        """Dispatch the gathers of the evicted blocks (block id, chain hash); they read kv_cache as it is now."""
        batches = []
        for start in range(0, len(saves), TIER_TRANSFER_BATCH):
            chunk = saves[start:start + TIER_TRANSFER_BATCH]
            ids = np.zeros(TIER_TRANSFER_BATCH, np.int32)
            ids[:len(chunk)] = [block_id for block_id, _ in chunk]
            gathered = self._gather(kv_cache, jax.device_put(ids, self._ids_sharding))
            batches.append(([block_hash for _, block_hash in chunk], gathered))
        return PendingSaves(batches)

    def finish_saves(self, pending: PendingSaves, straight_to_disk: bool = False) -> None:
        """Bring the gathered blocks to the host, shard by shard, and hand them to the tiers (to host memory, or
        with straight_to_disk, to the disk tier: a shutdown persisting the device's cached blocks)."""
        keep = self.tiers.persist if straight_to_disk else self.tiers.store
        for keys, gathered in pending.batches:
            shards: dict[int, np.ndarray] = {}
            for shard in gathered.addressable_shards:
                shards.setdefault(self._shard_of_device[shard.device], np.asarray(shard.data))
            ordered = [shards[number] for number in range(len(shards))]
            for row, key in enumerate(keys):
                # A copy per block: a view would keep the whole batch alive as long as any block of it.
                keep(key, [np.array(batch[row]) for batch in ordered])

    def load(self, kv_cache: jax.Array, loads: Sequence[tuple[int, object]]) -> jax.Array:
        """kv_cache with every (block id, BlockPayload) written in; the pool is donated."""
        for start in range(0, len(loads), TIER_TRANSFER_BATCH):
            chunk = loads[start:start + TIER_TRANSFER_BATCH]
            ids = np.zeros(TIER_TRANSFER_BATCH, np.int32)
            ids[:len(chunk)] = [block_id for block_id, _ in chunk]
            payloads = [payload for _, payload in chunk if isinstance(payload, BlockPayload)]
            assert len(payloads) == len(chunk)  # the scheduler only passes what KVTiers.fetch returned
            per_shard = [_stack([p.shards[number] for p in payloads]) for number in range(self.tiers.num_shards)]
            blocks = jax.make_array_from_callback(self._batch_shape, self._batch_sharding,
                                                  functools.partial(self._shard_rows, per_shard))
            kv_cache = self._scatter(kv_cache, jax.device_put(ids, self._ids_sharding), blocks)
        return kv_cache

    def _shard_rows(self, per_shard: list[np.ndarray], index: Optional[tuple]) -> np.ndarray:
        """The host rows of the device slice `index` of a batch: its shard's stacked blocks."""
        return per_shard[_shard_number(index, self._batch_shape, self.tiers.num_shards)]

    def measure_load_seconds(self, kv_cache: jax.Array, repeats: int = 3) -> tuple[jax.Array, float]:
        """Median seconds one full batch of loads takes (zeros into the null block); returns the pool too."""
        shard_shape = self._batch_sharding.shard_shape(self._batch_shape)[1:]  # one shard of one block
        zeros = BlockPayload(tuple(np.zeros(shard_shape, self._dtype) for _ in range(self.tiers.num_shards)))
        loads = [(0, zeros)] * TIER_TRANSFER_BATCH
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            kv_cache = self.load(kv_cache, loads)
            kv_cache.block_until_ready()
            seconds.append(time.perf_counter() - start)
        return kv_cache, statistics.median(seconds)


def min_blocks_worth_loading(load_batch_seconds: float, prefill_token_seconds: float, block_size: int,
                             max_blocks: int) -> int:
    """The fewest lower-tier blocks whose load (whole batches of TIER_TRANSFER_BATCH) takes less time than
    recomputing their tokens; max_blocks + 1 (never load) when no hit up to max_blocks does."""
    for num_blocks in range(1, max_blocks + 1):
        num_batches = -(-num_blocks // TIER_TRANSFER_BATCH)
        if num_batches * load_batch_seconds < num_blocks * block_size * prefill_token_seconds:
            return num_blocks
    return max_blocks + 1


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """rows as one [TIER_TRANSFER_BATCH, ...] array, zero rows padding the rest."""
    batch = np.zeros((TIER_TRANSFER_BATCH, *rows[0].shape), rows[0].dtype)
    batch[:len(rows)] = rows
    return batch


def _shard_number(index: Optional[tuple], shape: tuple[int, ...], num_shards: int) -> int:
    """Which of num_shards equal slices of the one split axis `index` (a tuple of slices) covers; 0 if none is."""
    for axis, part in enumerate(index or ()):
        if isinstance(part, slice) and part.start is not None and (part.stop - part.start) < shape[axis]:
            return part.start // (shape[axis] // num_shards)
    return 0
