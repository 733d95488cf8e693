"""KVCacheManager: each request's block table on top of the BlockPool, and the prefix cache lookups into it.

Block ids, not block objects, cross this class's boundary: the scheduler and the runner only need ids.
"""

from collections.abc import Sequence
from typing import Optional

from .block_pool import BlockPool
from .hashing import request_block_hash
from .request import Request


class KVCacheManager:
    """Allocates, caches and frees the blocks of requests; answers prefix-cache lookups."""

    def __init__(self, num_kv_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be a positive int, got {block_size!r}")
        self.block_size = block_size
        """Tokens per block."""
        self.enable_prefix_caching = enable_prefix_caching
        """Whether computed full blocks are shared across requests."""
        self.block_pool = BlockPool(num_kv_blocks, enable_caching=enable_prefix_caching)
        """The blocks themselves."""
        self.prefix_cache_queries = 0
        """Cumulative tokens of admitted requests looked up in the prefix cache."""
        self.prefix_cache_hits = 0
        """Cumulative tokens of those served from the prefix cache."""
        self._block_ids: dict[str, list[int]] = {}
        # How many leading blocks of each request are already registered in the prefix cache.
        self._num_cached_blocks: dict[str, int] = {}

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests, 0.0 to 1.0."""
        return self.block_pool.usage

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocation may take."""
        return self.block_pool.num_free_blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a live list: it grows as the request does); [] if it holds none."""
        return self._block_ids.get(request_id, [])

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Prefix-cache hit of a request with nothing computed yet: (hit block ids, hit tokens).

        Walks the chain of full blocks until the first miss. The hit never covers the whole request: its
        last token is always computed, so the logits to sample from exist.
        """
        if not self.enable_prefix_caching:
            return [], 0
        block_size = self.block_size
        get_cached_block = self.block_pool.get_cached_block
        hit_block_ids = []
        for block_index in range((request.num_tokens - 1) // block_size):
            block = get_cached_block(request_block_hash(request, block_index, block_size))
            if block is None:
                break
            hit_block_ids.append(block.block_id)
        return hit_block_ids, len(hit_block_ids) * block_size

    def record_prefix_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup in the prefix-cache counters."""
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_query_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_block_ids: Sequence[int] = ()) -> Optional[list[int]]:
        """Grow the request's block table to hold num_new_tokens more tokens; the newly allocated block ids.

        computed_block_ids are prefix-cache hits (from get_computed_blocks) that join the table first; the
        new tokens follow them. Returns None, changing nothing, when the free blocks do not suffice.
        """
        block_size = self.block_size
        block_ids = self._block_ids.get(request.request_id)
        num_held_blocks = len(block_ids) if block_ids is not None else 0
        num_tokens_after = (request.num_computed_tokens + len(computed_block_ids) * block_size + num_new_tokens)
        num_new_blocks = -(-num_tokens_after // block_size) - num_held_blocks - len(computed_block_ids)
        if num_new_blocks <= 0 and not computed_block_ids:
            return []  # the common decode step: the last block still has room
        pool = self.block_pool
        computed_blocks = [pool.blocks[block_id] for block_id in computed_block_ids]
        # Hit blocks nobody holds sit in the free queue: taking them shrinks what is left to allocate from.
        num_free_hit_blocks = sum(1 for block in computed_blocks if block.ref_cnt == 0)
        if num_new_blocks > pool.num_free_blocks - num_free_hit_blocks:
            return None
        if block_ids is None:
            block_ids = self._block_ids[request.request_id] = []
            self._num_cached_blocks[request.request_id] = 0
        if computed_blocks:
            # Touch before allocating, so allocation cannot evict the hit blocks.
            pool.touch(computed_blocks)
            block_ids.extend(computed_block_ids)
            self._num_cached_blocks[request.request_id] = len(block_ids)
        new_block_ids = [block.block_id for block in pool.get_new_blocks(max(num_new_blocks, 0))]
        block_ids.extend(new_block_ids)
        return new_block_ids

    def cache_full_blocks(self, request: Request) -> None:
        """Make every full block of the request's computed tokens hittable (call once their K/V is written)."""
        if not self.enable_prefix_caching:
            return
        request_id = request.request_id
        num_full_blocks = request.num_computed_tokens // self.block_size
        num_cached_blocks = self._num_cached_blocks.get(request_id, num_full_blocks)
        if num_full_blocks <= num_cached_blocks:
            return
        blocks = self.block_pool.blocks
        block_ids = self._block_ids[request_id]
        for block_index in range(num_cached_blocks, num_full_blocks):
            block_hash = request_block_hash(request, block_index, self.block_size)
            self.block_pool.cache_block(blocks[block_ids[block_index]], block_hash)
        self._num_cached_blocks[request_id] = num_full_blocks

    def free(self, request: Request) -> None:
        """Release all of the request's blocks, tail first, so a chain is evicted from its end."""
        block_ids = self._block_ids.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        if block_ids:
            blocks = self.block_pool.blocks
            self.block_pool.free_blocks(blocks[block_id] for block_id in reversed(block_ids))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request holds a block."""
        return self.block_pool.reset_prefix_cache()
