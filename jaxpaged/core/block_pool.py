"""BlockPool: every KV block, their reference counts, the free queue and the hash -> block map of cached blocks.

A block is in exactly one of three places: the null block 0 (padding only, never handed out), held by
requests (ref_cnt > 0, not in the free queue), or free (ref_cnt == 0, in the free queue). A free block
keeps its hash, and so stays hittable, until allocation takes it off the head of the queue.

Besides the hash map, cached blocks and the computed tails of finished requests are listed under their parent
key (the chain hash of the block before them), with their tokens: after the chain of full-block hits, a
token-granular lookup copies the longest matching run of tokens out of one of them (see KVCacheManager).
"""

from collections.abc import Iterable, Sequence
from typing import Optional

from .free_block_queue import FreeBlockQueue, KVCacheBlock
from .hashing import BlockHash
from .kv_events import KVEventLog

MAX_PARTIAL_CANDIDATES = 16
"""Token-granular lookups compare against at most this many blocks under one parent, newest first: the cost
per admitted request stays bounded however many questions follow one shared prefix."""

NULL_BLOCK_ID = 0
"""Padding rows of block tables and padded tokens' K/V writes point here."""


class BlockPool:
    """A fixed set of num_blocks KV blocks (the null block 0 included)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(f"num_blocks: must be an int >= 2 (block 0 is the null block), got {num_blocks!r}")
        self.num_blocks = num_blocks
        """All blocks, the null block included."""
        self.enable_caching = enable_caching
        """Whether full blocks are registered in the hash map."""
        self.blocks = [KVCacheBlock(block_id) for block_id in range(num_blocks)]
        """blocks[block_id]; read-only for callers."""
        self.null_block = self.blocks[NULL_BLOCK_ID]
        """Block 0: never allocated, never freed, never cached."""
        self._free_queue = FreeBlockQueue(self.blocks[NULL_BLOCK_ID + 1:])
        self._cached_blocks: dict[BlockHash, KVCacheBlock] = {}
        # parent key -> {block_id: block} of the blocks token-granular lookups may copy from, oldest first.
        self._children: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        self.evictions: Optional[list[tuple[int, BlockHash]]] = None
        """When a list (KV tiers on): (block id, chain hash) of every cached block allocation has evicted since
        the caller last emptied it, so its K/V can be copied down before the block is overwritten."""
        self.events: Optional[KVEventLog] = None
        """When a log (KV events on): evictions and resets are recorded in it (the KV cache manager records what
        it caches, knowing each block's place in its chain)."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks that allocation may take (cached free blocks included)."""
        return self._free_queue.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        """Blocks a request can ever hold: all but the null block."""
        return self.num_blocks - 1

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests, 0.0 to 1.0."""
        return 1.0 - self._free_queue.num_free_blocks / (self.num_blocks - 1)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take num_blocks blocks off the head of the free queue, dropping their cached hashes; ref_cnt 1 each."""
        blocks = self._free_queue.popleft_n(num_blocks)
        for block in blocks:
            if block.block_hash is not None:
                if self.evictions is not None:
                    self.evictions.append((block.block_id, block.block_hash))
                if self.events is not None:
                    self.events.removed(block.block_hash)
                self._evict(block)
            if block.parent_key is not None:
                self._unlist(block)
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """One more request holds each of these (prefix-cache hits); free ones leave the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self._free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks_in_eviction_order: Iterable[KVCacheBlock]) -> None:
        """One request fewer holds each; blocks nobody holds join the tail of the free queue in the given order."""
        for block in blocks_in_eviction_order:
            if block.ref_cnt <= 0:
                raise ValueError(f"block: {block.block_id} is freed more often than it was allocated")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free_queue.append(block)

    def free_unwritten_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Free blocks of one request that hold no computed K/V (room a speculative step allocated for proposals it
        rejected): they go to the head of the free queue, so the next allocation takes them before evicting any
        cached block."""
        for block in blocks:
            if block.ref_cnt != 1 or block.block_hash is not None:
                raise ValueError(f"block: {block.block_id} is shared or cached, not an unwritten block of one request")
            block.ref_cnt = 0
            self._free_queue.appendleft(block)

    def get_cached_block(self, block_hash: BlockHash) -> Optional[KVCacheBlock]:
        """The block holding the K/V of this chain hash, if it is still cached."""
        return self._cached_blocks.get(block_hash)

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash, parent_key: Optional[BlockHash] = None,
                    token_ids: tuple[int, ...] = ()) -> bool:
        """Make a full, computed block hittable under block_hash (and, given its parent key and tokens, a source
        for token-granular lookups); whether it became so.

        A block that is already cached keeps its hash; if another block already holds this hash (two
        requests computed the same prefix at once), the first one stays the cached copy.
        """
        if not self.enable_caching or block.block_hash is not None or block_hash in self._cached_blocks:
            return False
        block.block_hash = block_hash
        self._cached_blocks[block_hash] = block
        if parent_key is not None:
            self._list(block, parent_key, token_ids)
        return True

    def cache_partial_block(self, block: KVCacheBlock, parent_key: BlockHash, token_ids: tuple[int, ...]) -> None:
        """List a finished request's last, partly filled block (its K/V of token_ids computed) as a source for
        token-granular lookups; it stays listed until allocation takes it."""
        if self.enable_caching and block.block_hash is None and block.parent_key is None and token_ids:
            self._list(block, parent_key, token_ids)

    def longest_partial_match(self, parent_key: BlockHash,
                              token_ids: Sequence[int]) -> tuple[Optional[KVCacheBlock], int]:
        """The listed block under parent_key whose tokens share the longest leading run with token_ids, and
        that run's length ((None, 0) when none shares a token). Scans the newest MAX_PARTIAL_CANDIDATES."""
        children = self._children.get(parent_key)
        if not children:
            return None, 0
        best_block, best_run = None, 0
        for scanned, block in enumerate(reversed(children.values())):
            if scanned == MAX_PARTIAL_CANDIDATES:
                break
            run = 0
            for cached, wanted in zip(block.token_ids, token_ids):
                if cached != wanted:
                    break
                run += 1
            if run > best_run:
                best_block, best_run = block, run
        return best_block, best_run

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any request holds a block."""
        if self._free_queue.num_free_blocks != self.num_blocks - 1:
            return False
        for block in self._cached_blocks.values():
            block.block_hash = None
        self._cached_blocks.clear()
        for children in self._children.values():
            for block in children.values():
                block.parent_key, block.token_ids = None, ()
        self._children.clear()
        if self.events is not None:
            self.events.cleared()
        return True

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently registered in the prefix cache (held or free)."""
        return len(self._cached_blocks)

    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (head first); O(num_blocks), for tests and debugging."""
        return [block.block_id for block in self._free_queue]

    def _list(self, block: KVCacheBlock, parent_key: BlockHash, token_ids: tuple[int, ...]) -> None:
        block.parent_key, block.token_ids = parent_key, token_ids
        self._children.setdefault(parent_key, {})[block.block_id] = block

    def _unlist(self, block: KVCacheBlock) -> None:
        assert block.parent_key is not None  # only called on listed blocks
        children = self._children[block.parent_key]
        del children[block.block_id]
        if not children:
            del self._children[block.parent_key]
        block.parent_key, block.token_ids = None, ()

    def _evict(self, block: KVCacheBlock) -> None:
        assert block.block_hash is not None  # only called on cached blocks
        del self._cached_blocks[block.block_hash]
        block.block_hash = None
