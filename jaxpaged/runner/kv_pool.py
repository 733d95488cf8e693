"""KVPool: one rank's paged KV cache on its devices, and every way blocks move in it.

The pool is one array [layer slots, blocks, *page] that every KV layer group shares (KVSpec.groups; a block id
belongs to one group at a time, and layer l of its group keeps its page at slot(l)), donated to every call
that writes it so XLA updates it in place: the compiled step (compiled_step.py), the block copies of
copy-on-write prefix hits (block_copy.py) and the loads from the KV tiers below the device (tier_transfer.py).
Block 0 is the null block that padding writes to.

Ranks in lock step (runner/lock_step.py) keep one pool [ranks * layer slots, blocks, *page] whose axis 0 is split
over the mesh's data axis: rank r's slots are its own pool on its own devices, its block ids its scheduler's.
"""

from collections.abc import Callable, Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxpaged.kv_tiers import KVTiers
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.block_copy import copy_blocks, empty_copy_batch, padded_copy_batches
from jaxpaged.runner.kv_spec import KVSpec
from jaxpaged.runner.tier_transfer import PendingSaves, TierTransfer


def allocate_pool(spec: KVSpec, num_blocks: int, sharding: Optional[jax.sharding.Sharding] = None,
                  num_ranks: int = 1) -> jax.Array:
    """A zeroed pool of `num_blocks` blocks shaped as `spec` says (`num_ranks` such pools stacked on axis 0: ranks in
    lock step), created in place on its devices (each shard allocates only its part)."""
    shape, dtype = spec.pool_shape(num_blocks), spec.pool_dtype
    shape = (shape[0] * num_ranks, *shape[1:])
    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)()


class KVPool:
    """The donated KV cache of a rank, its block copies and its transfers to and from the KV tiers."""

    def __init__(self, spec: KVSpec, num_blocks: int, mesh: jax.sharding.Mesh) -> None:
        self.spec = spec
        """What a block is (the start-up plan's)."""
        self.num_blocks = num_blocks
        """Blocks in the pool, the null block included."""
        self.num_ranks = mesh.shape[mesh_lib.DATA_AXIS]
        """Ranks in lock step sharing the pool (1: a rank's own)."""
        self.sharding = jax.sharding.NamedSharding(mesh, mesh_lib.kv_cache_spec(spec.layout, self.num_ranks > 1))
        """Split by KV heads over the rank's model axis (every layout on its axis -2), and by rank over the data
        axis (axis 0) for ranks in lock step."""
        self._replicated = mesh_lib.replicated(mesh)
        self.cache = allocate_pool(spec, num_blocks, self.sharding, self.num_ranks)
        """The pool array; every writer donates it and stores the result back here."""
        copy, pairs_sharding = copy_blocks, self._replicated
        if self.num_ranks > 1:  # each rank's copies [ranks, batch, 2] on its own data shard, applied to its slots
            pairs_sharding = jax.sharding.NamedSharding(mesh, P(mesh_lib.DATA_AXIS))
            copy = jax.shard_map(lambda cache, pairs: copy_blocks(cache, pairs[0]), mesh=mesh,
                                 in_specs=(self.sharding.spec, pairs_sharding.spec), out_specs=self.sharding.spec,
                                 check_vma=False)
        self._pairs_sharding = pairs_sharding
        self._copy_jitted = jax.jit(copy, donate_argnums=(0,), in_shardings=(self.sharding, pairs_sharding),
                                    out_shardings=self.sharding)
        self._copy_compiled: Optional[jax.stages.Compiled] = None
        self.before_copy: Optional[Callable[[np.ndarray], None]] = None
        """Called with each batch of block copies before it runs (multi-host: broadcasts it to the followers)."""
        self.tier_transfer: Optional[TierTransfer] = None
        """Moves blocks to and from the KV tiers below the device, when they are on (attach_tiers)."""

    # ---- block copies (copy-on-write prefix hits) ----

    def copy_executable(self) -> jax.stages.Compiled:
        """The block copy, compiled once for its fixed batch (warm-up calls this)."""
        if self._copy_compiled is None:
            example = jax.device_put(self._rank_batches(empty_copy_batch()), self._pairs_sharding)
            self._copy_compiled = self._copy_jitted.lower(self.cache, example).compile()
        return self._copy_compiled

    def copy_blocks(self, pairs: np.ndarray) -> None:
        """Apply one padded batch of (source, destination) block copies to the pool, in place (ranks in lock step:
        [ranks, batch, 2], each rank's own)."""
        self.cache = self.copy_executable()(self.cache, jax.device_put(pairs, self._pairs_sharding))

    def _rank_batches(self, pairs: np.ndarray) -> np.ndarray:
        """One rank's padded batch as every rank's (the same null rows), for warm-up's example."""
        return pairs if self.num_ranks == 1 else np.stack([pairs] * self.num_ranks)

    def apply_rank_block_copies(self, block_copies: Sequence[Sequence[tuple[int, int]]]) -> None:
        """Ranks in lock step: each rank's copies of a step (block_copies[r], in its own block ids), every rank's
        next batch in one call."""
        batches = [list(padded_copy_batches(copies)) for copies in block_copies]
        for index in range(max(map(len, batches))):
            self.copy_blocks(np.stack([own[index] if index < len(own) else empty_copy_batch() for own in batches]))

    def apply_block_copies(self, block_copies: Sequence[tuple[int, int]]) -> None:
        """A step's copies, in fixed batches (each announced to before_copy first)."""
        for pairs in padded_copy_batches(block_copies):
            if self.before_copy is not None:
                self.before_copy(pairs)
            self.copy_blocks(pairs)

    # ---- the KV tiers below the device ----

    def attach_tiers(self, tiers: KVTiers) -> None:
        """Offload evicted blocks to `tiers` and load lower-tier hits from them (compiles the two transfers)."""
        self.tier_transfer = TierTransfer(self.cache, self.spec, tiers)

    def start_tier_transfers(self, saves: Sequence[tuple[int, bytes]],
                             loads: Sequence[tuple[int, object]]) -> Optional[PendingSaves]:
        """Dispatch the gathers of evicted blocks (they read the pool first), then write the loaded ones in; the
        pending saves, for finish_tier_saves() while the step runs (None when the step moves nothing)."""
        if not saves and not loads:
            return None
        assert self.tier_transfer is not None  # the scheduler only plans transfers when the tiers are on
        pending = self.tier_transfer.start_saves(self.cache, saves)
        self.cache = self.tier_transfer.load(self.cache, loads)
        return pending

    def finish_tier_saves(self, pending: Optional[PendingSaves]) -> None:
        """Hand the gathered blocks to the tiers (host copies, while the device runs the step)."""
        if pending is not None:
            assert self.tier_transfer is not None
            self.tier_transfer.finish_saves(pending)

    def measure_load_seconds(self) -> float:
        """Median seconds one full batch of tier loads takes (written into the null block)."""
        assert self.tier_transfer is not None
        self.cache, seconds = self.tier_transfer.measure_load_seconds(self.cache)
        return seconds
