"""KV events of the tiers below the device pool: a block stored in host memory ("CPU") or on disk ("DISK"), a block
one of them dropped, in the same records (and the same logs) as the device pool's events (core/kv_events.py).

The tiers only keep chain hashes; a BlockStored event also names the block's parent, tokens and extra keys. The
device knew them when it cached the block (its BlockStored was built from them), so each KV cache manager keeps
them per cached block (BlockRecord) and hands them to the TierEventRecorder when the pool evicts the block towards
the tiers; the recorder keeps them while some tier holds the block.

Disk files that an earlier process wrote carry no tokens (the file header names the chain hash, the fingerprint and
the payload only), so their BlockStored events have empty token_ids and no parent. NOTE: a deliberate choice over
adding tokens to the header: a new header would mean a new format version, and every warm disk tier out there would
turn into misses at the upgrade; a router keyed on the engine's block hashes still follows them, and the tokens are
announced again (medium "GPU") as soon as such a block is loaded.

Reset: the device pool's AllBlocksCleared means every medium of the rank (the host tier is cleared with it); the
disk tier survives a reset by design, so its blocks are announced again right after the AllBlocksCleared.
Plain Python, like the rest of core/.
"""

import dataclasses
from collections.abc import Sequence
from typing import Optional

from .hashing import BlockHash
from .kv_events import MEDIUM_DISK, MEDIUM_HOST, KVEventLog


@dataclasses.dataclass(frozen=True, slots=True)
class BlockRecord:
    """What a BlockStored event says of a block besides its chain hash."""

    parent_block_hash: Optional[BlockHash]
    """The chain hash of the block before it; None for a prompt's first block (or when unknown)."""
    token_ids: tuple[int, ...]
    """Its tokens; () when unknown (a disk file from an earlier process)."""
    extra_keys: tuple = ()
    """What besides its tokens went into its hash (the cache salt)."""


UNKNOWN_BLOCK = BlockRecord(None, ())
"""The record of a block only known by its hash."""


class TierEventRecorder:
    """Turns the lower tiers' changes into KV events in every data-parallel rank's log (the tiers are shared: any
    rank can load what they hold)."""

    def __init__(self, logs: Sequence[KVEventLog]) -> None:
        self._logs = list(logs)
        self._records: dict[BlockHash, BlockRecord] = {}
        # What each medium holds as announced; events are only sent for changes to these sets.
        self._held: dict[str, set[BlockHash]] = {MEDIUM_HOST: set(), MEDIUM_DISK: set()}
        self._announce_disk = False
        # Blocks some medium dropped, whose records are forgotten at flush() unless a medium holds them again: host
        # memory evicts a block before the disk takes it in.
        self._dropped: set[BlockHash] = set()

    def remember(self, block_hash: BlockHash, record: Optional[BlockRecord]) -> None:
        """The device pool hands the block down (or a tier already holds it): keep what its events need."""
        if record is not None:
            self._records[block_hash] = record

    def stored(self, medium: str, block_hash: BlockHash) -> None:
        """The block landed in `medium` (announced once, however often it is rewritten)."""
        held = self._held[medium]
        if block_hash in held:
            return
        held.add(block_hash)
        record = self._records.get(block_hash, UNKNOWN_BLOCK)
        for log in self._logs:
            log.stored(block_hash, record.parent_block_hash, record.token_ids, record.extra_keys, medium)

    def removed(self, medium: str, block_hash: BlockHash) -> None:
        """`medium` dropped the block (evicted past its bound, found damaged, removed by another engine)."""
        held = self._held[medium]
        if block_hash not in held:
            return
        held.remove(block_hash)
        for log in self._logs:
            log.removed(block_hash, medium)
        self._dropped.add(block_hash)

    def cleared(self, medium: str) -> None:
        """A prefix-cache reset emptied `medium`. No events: the device pool's AllBlocksCleared, which the same reset
        records next, covers every medium; flush() then announces the disk tier's blocks again."""
        held, self._held[medium] = self._held[medium], set()
        self._dropped.update(held)
        self._announce_disk = True

    def flush(self) -> None:
        """Before the logs are taken: after a reset, announce again what survived it (the disk tier); forget the
        records of blocks no medium holds."""
        if self._announce_disk:
            self._announce_disk = False
            disk, self._held[MEDIUM_DISK] = self._held[MEDIUM_DISK], set()
            for block_hash in disk:
                self.stored(MEDIUM_DISK, block_hash)
        for block_hash in self._dropped:
            if not any(block_hash in held for held in self._held.values()):
                self._records.pop(block_hash, None)
        self._dropped.clear()
