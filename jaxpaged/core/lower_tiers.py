"""LowerTiers: what the prefix cache sees of the KV tiers below the device pool (host memory, local disk).

The scheduler only deals in chain hashes and opaque payloads: the tiers themselves (numpy arrays, files) live in
jaxpaged/kv_tiers, and the runner moves the bytes. A block the device pool evicts is offloaded (its K/V copied
down before the step that reuses the block runs); a chain that continues below the device is loaded into freshly
allocated blocks before the step that reads them.
"""

from typing import Optional, Protocol

from .hashing import BlockHash


class LowerTiers(Protocol):
    """The tiers below the device, as the KV cache manager uses them."""

    def holds(self, block_hash: BlockHash) -> bool:
        """Whether some tier holds the block (a cheap index lookup; the bytes are only checked by fetch())."""
        ...

    def fetch(self, block_hash: BlockHash) -> Optional[object]:
        """The block's payload for the runner to load, read and verified now; None if it is gone or damaged."""
        ...

    def touch(self, block_hash: BlockHash) -> None:
        """The device evicted a block some tier already holds: mark it recently used there instead of copying."""
        ...
