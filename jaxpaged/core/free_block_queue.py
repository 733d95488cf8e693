"""KVCacheBlock and the free-block queue: an intrusive doubly linked list, least recently freed first.

A plain Python list or deque cannot take a block out of the middle in O(1), and a prefix-cache hit on a
freed block has to do exactly that (the block becomes in use again). The links live on the blocks.
"""

from collections.abc import Iterator
from typing import Optional


class KVCacheBlock:
    """One block of the KV cache: its id, how many requests hold it, and its chain hash while cached."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "parent_key", "token_ids", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        """Index of the block in the device KV cache."""
        self.ref_cnt = 0
        """How many requests hold the block in their block table."""
        self.block_hash: Optional[bytes] = None
        """Chain hash of the full block's contents while it is in the prefix cache, else None."""
        self.parent_key: Optional[bytes] = None
        """While a token-granular lookup may copy from this block: the chain key of what precedes it."""
        self.token_ids: tuple[int, ...] = ()
        """While parent_key is set: the tokens whose K/V the block holds (block_size of them if full, fewer if
        it is the finished tail of a request)."""
        self.prev_free: Optional[KVCacheBlock] = None
        """Neighbour towards the head of the free queue (None while not in the queue)."""
        self.next_free: Optional[KVCacheBlock] = None
        """Neighbour towards the tail of the free queue (None while not in the queue)."""

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Free blocks in eviction order: popped from the head, freed blocks appended at the tail."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        # Sentinels at both ends remove every "is this the first/last block" branch.
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        """Blocks currently in the queue."""
        for block in blocks:
            self.append(block)

    def popleft_n(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take the num_blocks least recently freed blocks off the head."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"num_blocks: only {self.num_free_blocks} blocks are free, asked for {num_blocks}")
        popped: list[KVCacheBlock] = []
        block = self._head.next_free
        for _ in range(num_blocks):
            assert block is not None  # num_blocks <= num_free_blocks: stops at the tail sentinel at the latest
            popped.append(block)
            following = block.next_free
            block.prev_free = block.next_free = None
            block = following
        assert block is not None
        self._head.next_free = block
        block.prev_free = self._head
        self.num_free_blocks -= num_blocks
        return popped

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink a block from anywhere in the queue (a prefix-cache hit on a free block)."""
        if block.prev_free is None:
            raise ValueError(f"block: {block.block_id} is not in the free queue")
        following = block.next_free
        assert following is not None  # a queued block has both neighbours (the sentinels at the ends)
        block.prev_free.next_free = following
        following.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put a block at the tail (evicted last)."""
        last = self._tail.prev_free
        assert last is not None  # the tail sentinel always has a predecessor (the head sentinel at least)
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def appendleft(self, block: KVCacheBlock) -> None:
        """Put a block at the head (allocated next): it holds nothing worth keeping."""
        first = self._head.next_free
        assert first is not None  # the head sentinel always has a successor (the tail sentinel at least)
        block.prev_free = self._head
        block.next_free = first
        first.prev_free = block
        self._head.next_free = block
        self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not self._tail:
            assert block is not None  # the chain from the head sentinel always reaches the tail sentinel
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free_blocks
