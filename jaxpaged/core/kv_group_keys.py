"""Prefix-cache keys of KV cache groups, and the KV event log that reads them.

With KV cache groups (kv_cache_groups.py) the same tokens make different K/V in each group, so a block is cached,
offloaded to the KV tiers and looked up under (group, chain hash): two bytes of group index before the 32-byte chain
hash (vLLM's BlockHashWithGroupId; its offload key also pairs the hash with the group). One key never serves
another group, in the device pool or in a tier.

KV events name the chain hash and the group apart, as vLLM's do since its hybrid KV cache manager: BlockStored and
BlockRemoved carry `group_idx`, and BlockStored the group's `kv_cache_spec_kind` ("full_attention" or
"sliding_window") and `kv_cache_spec_sliding_window`. GroupedKVEventLog splits the keys it is handed, so the block
pool's evictions and the tiers' events (which only know keys) come out per group too.
"""

from collections.abc import Sequence
from typing import Optional

from .hashing import BlockHash
from .kv_events import KVEventLog

GROUP_KEY_BYTES = 2
"""Bytes of the group index before the chain hash in a group's key."""

CHAIN_HASH_BYTES = 32
"""A chain hash's length (hashing.py: sha256)."""

SPEC_KIND_FULL = "full_attention"
SPEC_KIND_SLIDING = "sliding_window"
"""vLLM's KVCacheSpecKind values for the two kinds of group."""


def group_key(group: int, block_hash: BlockHash) -> BlockHash:
    """The prefix-cache key of a chain hash in one group: the same tokens of two groups are different K/V."""
    return group.to_bytes(GROUP_KEY_BYTES, "big") + block_hash


def split_group_key(key: BlockHash) -> tuple[BlockHash, Optional[int]]:
    """(chain hash, group) of a group's key; (key, None) for a key of one chain hash alone (a groups-off pool's,
    or a disk file written by one)."""
    if len(key) != GROUP_KEY_BYTES + CHAIN_HASH_BYTES:
        return key, None
    return key[GROUP_KEY_BYTES:], int.from_bytes(key[:GROUP_KEY_BYTES], "big")


class GroupedKVEventLog(KVEventLog):
    """A rank's KV events when the layers are grouped: each event names its chain hash, group and group's kind."""

    def __init__(self, block_size: int, group_windows: Sequence[Optional[int]]) -> None:
        super().__init__(block_size)
        self.group_windows = tuple(group_windows)
        """Per group: its sliding window, None for full attention."""

    def split_key(self, block_key: BlockHash) -> tuple[BlockHash, Optional[int]]:
        """(chain hash, group) of a group's key."""
        chain_hash, group = split_group_key(block_key)
        if group is not None and group >= len(self.group_windows):
            return block_key, None  # not one of this pool's groups: published as the key it is
        return chain_hash, group

    def group_spec(self, group: Optional[int]) -> tuple[Optional[str], Optional[int]]:
        """(vLLM's kv_cache_spec_kind, sliding window) of the group."""
        if group is None:
            return None, None
        window = self.group_windows[group]
        return (SPEC_KIND_FULL, None) if window is None else (SPEC_KIND_SLIDING, window)
