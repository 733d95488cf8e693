"""KV cache events: which blocks the prefix cache holds, as the cache changes, for a router outside the engine.

The records follow vLLM's KV events (vllm/distributed/kv_events.py) field for field, so a consumer written for vLLM
(a KV-aware router) reads jaxpaged's too: a block stored (its chain hash, its parent's, its tokens), blocks removed,
everything cleared. The KV cache manager and the block pool append them to a KVEventLog as they cache, evict and
reset; features/kv_events.py drains the logs after each step and publishes them. Plain Python: core/ stays free of
JAX and of the publisher's packages.
"""

import dataclasses
from typing import Optional, Union

from .hashing import BlockHash

# Where a block's K/V lives, in vLLM's words: consumers tell "GPU" (accelerator memory; a TPU's HBM too) from "CPU"
# (vLLM's CPU offloading: jaxpaged's host-memory tier). vLLM has no name for a disk; jaxpaged's disk tier says "DISK".
# The tiers' events are recorded by core/tier_events.py.
MEDIUM_DEVICE = "GPU"
MEDIUM_HOST = "CPU"
MEDIUM_DISK = "DISK"


@dataclasses.dataclass(frozen=True)
class BlockStored:
    """Blocks became hittable in `medium`; each block's parent is the one before it, the first one's
    parent_block_hash."""

    block_hashes: tuple[BlockHash, ...]
    """Chain hashes, in chain order."""
    parent_block_hash: Optional[BlockHash]
    """The chain hash of the block before the first one; None when the first one starts its prompt."""
    token_ids: tuple[int, ...]
    """The blocks' tokens, block_size per block."""
    block_size: int
    medium: str
    extra_keys: tuple[Optional[tuple], ...]
    """Per block, what besides its tokens went into its hash: ("cache_salt", salt) for a salted prompt's first block,
    ("lora", id, name) for every block of a LoRA adapter's request (both, in that order, may join), else None (a
    consumer recomputing hashes needs it; the salt also scopes the chain to one tenant)."""
    group_idx: Optional[int] = None
    """The KV cache group whose blocks these are (core/kv_group_keys.py); None with one group, as vLLM leaves it
    unset without a hybrid KV cache manager."""
    kv_cache_spec_kind: Optional[str] = None
    """The group's attention kind in vLLM's words: "full_attention" or "sliding_window"; None with one group."""
    kv_cache_spec_sliding_window: Optional[int] = None
    """The group's window in tokens for a sliding group, else None."""


@dataclasses.dataclass(frozen=True)
class BlockRemoved:
    """Blocks stopped being hittable in `medium` (allocation evicted them, a tier dropped them)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str
    group_idx: Optional[int] = None
    """The KV cache group whose blocks these were; None with one group."""


@dataclasses.dataclass(frozen=True)
class AllBlocksCleared:
    """The prefix cache was reset: every block announced before, in every medium, is gone (a tier that survives the
    reset, the disk, is announced again after it)."""


KVCacheEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventLog:
    """The events of one data-parallel rank's cache since they were last taken, in the order they happened."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._events: list[KVCacheEvent] = []

    def stored(self, block_hash: BlockHash, parent_block_hash: Optional[BlockHash], token_ids: tuple[int, ...],
               extra_keys: tuple = (), medium: str = MEDIUM_DEVICE) -> None:
        """One block became hittable (block_hash: its prefix-cache key, a group's key with KV cache groups)."""
        chain_hash, group = self.split_key(block_hash)
        kind, window = self.group_spec(group)
        self._events.append(BlockStored((chain_hash,), parent_block_hash, token_ids, self.block_size, medium,
                                        (extra_keys or None,), group, kind, window))

    def removed(self, block_hash: BlockHash, medium: str = MEDIUM_DEVICE) -> None:
        """One block stopped being hittable."""
        chain_hash, group = self.split_key(block_hash)
        self._events.append(BlockRemoved((chain_hash,), medium, group))

    def split_key(self, block_key: BlockHash) -> tuple[BlockHash, Optional[int]]:
        """(chain hash, KV cache group) of a prefix-cache key: the key itself and no group here (one group)."""
        return block_key, None

    def group_spec(self, group: Optional[int]) -> tuple[Optional[str], Optional[int]]:
        """(vLLM's kv_cache_spec_kind, sliding window) of a group; (None, None) for no group."""
        del group
        return None, None

    def cleared(self) -> None:
        """Every block is gone; events before this one no longer matter."""
        self._events = [AllBlocksCleared()]

    def take(self) -> list[KVCacheEvent]:
        """The events since the last call, oldest first."""
        events, self._events = self._events, []
        return events
