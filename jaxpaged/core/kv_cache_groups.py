"""GroupedKVCacheManager: block tables per KV layer group, for models with sliding-window layers (vLLM's hybrid KV
cache manager, vllm/v1/core/kv_cache_coordinator.py; the design in runner/kv_spec.py).

Every group draws its block ids from the one BlockPool; a request holds one block table per group. A full-attention
group keeps every block of the request. A sliding group (window w) keeps only the blocks that a query at or after
the request's next position can still read: the blocks wholly before position num_computed_tokens - w + 1 go back
to the pool as the request advances (cached ones stay hittable, evictable), and their table entries become the
null block 0, which the attention masks out.

Prefix-cache entries are keyed by (group, chain hash). A hit of L blocks needs every block of the chain up to L in
each full group, and in each sliding group only the blocks the first computed token's window reaches back into; the
longest L that every group allows is found right to left for sliding groups (vLLM's rule), repeated until no group
shortens it. Token-granular hits copy the next, partly matching block in every group (the shortest run of them).
"""

from collections.abc import Sequence
from typing import Optional

from .block_pool import NULL_BLOCK_ID
from .free_block_queue import KVCacheBlock
from .hashing import BlockHash, request_block_hash, request_parent_key
from .kv_cache_manager import KVCacheManager, PrefixHit
from .request import Request


def group_key(group: int, block_hash: BlockHash) -> BlockHash:
    """The prefix-cache key of a chain hash in one group: the same tokens of two groups are different K/V."""
    return group.to_bytes(2, "big") + block_hash


def sliding_blocks_skipped(num_computed_tokens: int, window: int, block_size: int) -> int:
    """Leading blocks no query from position num_computed_tokens on reads in a window of `window` tokens: a query
    at position q reads positions q - window + 1 .. q."""
    return max(num_computed_tokens - window + 1, 0) // block_size


def sequence_blocks(num_tokens: int, block_size: int, group_windows: Sequence[Optional[int]],
                    num_chunk_tokens: int = 1) -> int:
    """Blocks one sequence of num_tokens tokens holds at most over every group, its steps computing up to
    num_chunk_tokens tokens at once: all of its blocks in a full group; in a sliding group (window w) the blocks a
    step's first query reads back into plus the step's, at most ceil((w + C - 2) / block_size) + 1 (a decode:
    ceil((w - 1) / block_size) + 1, vLLM's count)."""
    whole = -(-num_tokens // block_size)
    chunk = max(num_chunk_tokens, 1)
    return sum(whole if window is None else min(whole, -(-(window + chunk - 2) // block_size) + 1)
               for window in group_windows)


def max_sequence_tokens(num_usable_blocks: int, block_size: int, group_windows: Sequence[Optional[int]],
                        num_chunk_tokens: int, limit: int) -> int:
    """The most tokens, at most `limit`, of one sequence whose blocks (sequence_blocks) fit num_usable_blocks."""
    def fits(num_tokens: int) -> bool:
        return sequence_blocks(num_tokens, block_size, group_windows, num_chunk_tokens) <= num_usable_blocks

    if fits(limit):
        return limit
    low, high = 0, limit  # blocks only grow with the tokens
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


class GroupedKVCacheManager(KVCacheManager):
    """Allocates, caches and frees blocks per KV layer group; answers prefix-cache lookups over every group."""

    def __init__(self, num_kv_blocks: int, block_size: int, group_windows: Sequence[Optional[int]],
                 enable_prefix_caching: bool = True, token_granular: bool = True) -> None:
        super().__init__(num_kv_blocks, block_size, enable_prefix_caching, token_granular)
        if not group_windows or any(w is not None and (not isinstance(w, int) or w < 1) for w in group_windows):
            raise ValueError(f"group_windows: one positive int or None per group, got {group_windows!r}")
        self.group_windows = tuple(group_windows)
        """Per group: its sliding window, None for full attention."""
        self._tables: dict[str, list[list[int]]] = {}
        """Request id -> its block table per group (null block 0 where a sliding group freed a block)."""
        self._num_cached: dict[str, list[int]] = {}
        """Request id -> per group, the leading blocks already registered in the prefix cache (or skipped)."""
        self._num_skipped: dict[str, list[int]] = {}
        """Request id -> per group, the leading blocks given back as out of the window."""

    @property
    def num_groups(self) -> int:  # pyright: ignore[reportIncompatibleVariableOverride]
        """Block tables per request."""
        return len(self.group_windows)

    def blocks_for_tokens(self, num_tokens: int, num_chunk_tokens: int = 0) -> int:
        """Blocks one request of num_tokens tokens holds at most over every group, its last step computing
        num_chunk_tokens tokens at once (a sliding group keeps its window plus that step's tokens)."""
        return sequence_blocks(num_tokens, self.block_size, self.group_windows, num_chunk_tokens)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table of group 0 (a live list); [] if it holds none."""
        tables = self._tables.get(request_id)
        return tables[0] if tables else []

    def get_group_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table of every group (live lists, replaced when a sliding group frees blocks)."""
        return tuple(self._tables.get(request_id, ()))

    # ---- prefix-cache lookups ----

    def find_prefix_hit(self, request: Request) -> PrefixHit:
        """The longest prefix every group holds (never the whole request), then, token-granular, the longest run of
        the next tokens that a listed block after the same chain holds in every group."""
        if not self.enable_prefix_caching or request.computes_whole_prompt:
            return PrefixHit([], 0)
        block_size = self.block_size
        cached = self.block_pool.get_cached_block
        num_blocks = (request.num_tokens - 1) // block_size
        hashes = [request_block_hash(request, index, block_size) for index in range(num_blocks)]
        windows = self.group_windows
        for group, window in enumerate(windows):  # full groups: the chain from the start
            if window is None:
                num_blocks = next((index for index in range(num_blocks)
                                   if cached(group_key(group, hashes[index])) is None), num_blocks)
        while True:  # sliding groups shorten it until every one of them holds its window of the hit
            shortened = num_blocks
            for group, window in enumerate(windows):
                if window is not None:
                    shortened = self._sliding_hit(group, window, hashes, shortened)
            if shortened == num_blocks:
                break
            num_blocks = shortened
        num_hit_tokens = num_blocks * block_size
        group_ids = tuple(self._hit_block_ids(group, window, hashes, num_blocks, num_hit_tokens)
                          for group, window in enumerate(windows))
        num_wanted = min(block_size, request.num_tokens - 1 - num_hit_tokens)
        if self.token_granular and num_wanted > 0:
            parent_key = request_parent_key(request, num_blocks, block_size)
            wanted = request.all_token_ids[num_hit_tokens:num_hit_tokens + num_wanted]
            sources, run = [], num_wanted
            for group in range(len(windows)):
                source, group_run = self.block_pool.longest_partial_match(group_key(group, parent_key), wanted)
                if source is None:
                    run = 0
                    break
                sources.append(source.block_id)
                run = min(run, group_run)
            if run > 0:
                return PrefixHit(list(group_ids[0]), num_hit_tokens + run, sources[0], run,
                                 group_block_ids=group_ids, group_copy_sources=tuple(sources))
        return PrefixHit(list(group_ids[0]), num_hit_tokens, group_block_ids=group_ids)

    def _sliding_hit(self, group: int, window: int, hashes: Sequence[BlockHash], num_blocks: int) -> int:
        """The most blocks, at most num_blocks, that a hit may cover in a sliding group: the blocks from the one the
        first computed token's window starts in up to the hit's end must be cached. Scans right to left."""
        cached = self.block_pool.get_cached_block
        block_size = self.block_size
        while num_blocks > 0:
            first = sliding_blocks_skipped(num_blocks * block_size, window, block_size)
            missing = next((index for index in range(num_blocks - 1, first - 1, -1)
                            if cached(group_key(group, hashes[index])) is None), None)
            if missing is None:
                return num_blocks
            num_blocks = missing
        return 0

    def _hit_block_ids(self, group: int, window: Optional[int], hashes: Sequence[BlockHash], num_blocks: int,
                       num_hit_tokens: int) -> tuple[int, ...]:
        """The group's table of a hit of num_blocks blocks: its cached blocks, the null block where a sliding
        group needs none."""
        first = 0 if window is None else sliding_blocks_skipped(num_hit_tokens, window, self.block_size)
        cached = self.block_pool.get_cached_block
        block_ids = []
        for index in range(num_blocks):
            block = cached(group_key(group, hashes[index])) if index >= first else None
            block_ids.append(NULL_BLOCK_ID if block is None else block.block_id)
        return tuple(block_ids)

    # ---- allocation ----

    def allocate_hit(self, request: Request, num_new_tokens: int, hit: PrefixHit) -> Optional[list[int]]:
        """A waiting request's hit blocks and the blocks of its first num_new_tokens tokens after the hit, in every
        group; None, changing nothing, when the free blocks do not suffice."""
        assert not hit.lower_tier_hashes, "the KV tiers are off while the layers are grouped"
        return self._grow(request, num_new_tokens, hit)

    def allocate_slots(self, request: Request, num_new_tokens: int, computed_block_ids: Sequence[int] = (),
                       copy_source: Optional[int] = None, num_copied_tokens: int = 0,
                       num_loaded_blocks: int = 0) -> Optional[list[int]]:
        """Grow every group's table to hold num_new_tokens more tokens (hits come through allocate_hit); the newly
        allocated block ids, or None, changing nothing but the release of blocks out of the window, when the free
        blocks do not suffice."""
        if computed_block_ids or copy_source is not None or num_loaded_blocks:
            raise ValueError("computed_block_ids: grouped prefix hits go through allocate_hit")
        return self._grow(request, num_new_tokens, None)

    def _grow(self, request: Request, num_new_tokens: int, hit: Optional[PrefixHit]) -> Optional[list[int]]:
        block_size = self.block_size
        pool = self.block_pool
        request_id = request.request_id
        start = request.num_computed_tokens + (hit.num_tokens if hit is not None else 0)
        num_blocks_after = -(-(start + num_new_tokens) // block_size)
        tables = self._tables.get(request_id)
        if tables is not None:
            self._release_out_of_window(request_id, tables, start)
        hit_tables: list[list[int]] = [[] for _ in self.group_windows]
        held: list[KVCacheBlock] = []
        if hit is not None and hit.group_block_ids:
            for group, window in enumerate(self.group_windows):
                first = 0 if window is None else sliding_blocks_skipped(start, window, block_size)
                ids = [block_id if index >= first else NULL_BLOCK_ID
                       for index, block_id in enumerate(hit.group_block_ids[group])]
                hit_tables[group] = ids
                held += [pool.blocks[block_id] for block_id in ids if block_id != NULL_BLOCK_ID]
            held += [pool.blocks[block_id] for block_id in hit.group_copy_sources]
        num_held = [len(table) for table in tables] if tables is not None else [0] * self.num_groups
        needed = [num_blocks_after - num_held[group] - len(hit_tables[group]) for group in range(self.num_groups)]
        num_needed = sum(max(count, 0) for count in needed)
        if num_needed == 0 and not held:
            return []
        num_free_hit_blocks = sum(1 for block in held if block.ref_cnt == 0)
        if num_needed > pool.num_free_blocks - num_free_hit_blocks:
            return None
        if tables is None:
            tables = self._tables[request_id] = [[] for _ in self.group_windows]
            self._num_cached[request_id] = [0] * self.num_groups
            self._num_skipped[request_id] = [0] * self.num_groups
        if held:
            pool.touch(held)  # before allocating, so allocation cannot evict them
            for group, ids in enumerate(hit_tables):
                tables[group].extend(ids)
                self._num_cached[request_id][group] = len(ids)
                self._num_skipped[request_id][group] = next(
                    (index for index, block_id in enumerate(ids) if block_id != NULL_BLOCK_ID), len(ids))
        new_blocks = pool.get_new_blocks(num_needed)
        new_block_ids = [block.block_id for block in new_blocks]
        taken = 0
        for group, count in enumerate(needed):
            group_new = new_block_ids[taken:taken + max(count, 0)]
            taken += len(group_new)
            if hit is not None and hit.group_copy_sources:
                self._block_copies.append((hit.group_copy_sources[group], group_new[0]))
                self._held_copy_sources.append(pool.blocks[hit.group_copy_sources[group]])
            tables[group].extend(group_new)
        return new_block_ids

    def _release_out_of_window(self, request_id: str, tables: list[list[int]], start: int) -> None:
        """Give back each sliding group's blocks that no query from position `start` on reads (tail first, so a
        cached chain is evicted from its end); their entries become the null block, in a new list (the runner's
        host block table mirrors lists by identity)."""
        skipped = self._num_skipped[request_id]
        blocks = self.block_pool.blocks
        for group, window in enumerate(self.group_windows):
            if window is None:
                continue
            table = tables[group]
            first_kept = min(sliding_blocks_skipped(start, window, self.block_size), len(table))
            if first_kept <= skipped[group]:
                continue
            freed = [block_id for block_id in table[skipped[group]:first_kept] if block_id != NULL_BLOCK_ID]
            self.block_pool.free_blocks(blocks[block_id] for block_id in reversed(freed))
            tables[group] = [NULL_BLOCK_ID] * first_kept + table[first_kept:]
            skipped[group] = first_kept

    # ---- caching and freeing ----

    def cache_full_blocks(self, request: Request) -> None:
        """Make every full block of the request's computed tokens hittable in every group that still holds it."""
        if not self.enable_prefix_caching:
            return
        tables = self._tables.get(request.request_id)
        if not tables:
            return
        block_size = self.block_size
        num_full_blocks = request.num_computed_tokens // block_size
        num_cached = self._num_cached[request.request_id]
        for group, table in enumerate(tables):
            for block_index in range(num_cached[group], min(num_full_blocks, len(table))):
                block_id = table[block_index]
                if block_id != NULL_BLOCK_ID:
                    self._cache_group_block(request, group, block_id, block_index)
            num_cached[group] = max(num_cached[group], min(num_full_blocks, len(table)))

    def _cache_group_block(self, request: Request, group: int, block_id: int, block_index: int) -> None:
        """Register one full, computed block of one group under (group, chain hash)."""
        block_size = self.block_size
        start = block_index * block_size
        listing = ((group_key(group, request_parent_key(request, block_index, block_size)),
                    tuple(request.all_token_ids[start:start + block_size])) if self.token_granular else (None, ()))
        self.block_pool.cache_block(self.block_pool.blocks[block_id],
                                    group_key(group, request_block_hash(request, block_index, block_size)), *listing)

    def trim_blocks(self, request: Request) -> None:
        """Free every group's blocks past the request's computed tokens (rejected proposals), in new lists."""
        tables = self._tables.get(request.request_id)
        if not tables:
            return
        num_needed = -(-request.num_computed_tokens // self.block_size)
        blocks = self.block_pool.blocks
        for group, table in enumerate(tables):
            if len(table) > num_needed:
                self.block_pool.free_unwritten_blocks(blocks[block_id] for block_id in reversed(table[num_needed:]))
                tables[group] = table[:num_needed]

    def free(self, request: Request, tail_is_computed: bool = True) -> None:
        """Release every group's blocks, tail first; token-granular, a partly filled computed last block stays
        listed as a copy source in its group."""
        tables = self._tables.pop(request.request_id, None)
        self._num_cached.pop(request.request_id, None)
        self._num_skipped.pop(request.request_id, None)
        if not tables:
            return
        blocks = self.block_pool.blocks
        block_size = self.block_size
        num_computed = request.num_computed_tokens
        tail_index, num_tail_tokens = divmod(num_computed, block_size)
        for group, table in enumerate(tables):
            if (self.token_granular and tail_is_computed and num_tail_tokens and tail_index < len(table)
                    and table[tail_index] != NULL_BLOCK_ID):
                self.block_pool.cache_partial_block(
                    blocks[table[tail_index]], group_key(group, request_parent_key(request, tail_index, block_size)),
                    tuple(request.all_token_ids[tail_index * block_size:num_computed]))
            self.block_pool.free_blocks(blocks[block_id] for block_id in reversed(table) if block_id != NULL_BLOCK_ID)

    def record_kv_events(self):
        """KV events are not recorded per group: the engine turns the groups off when they are configured."""
        raise ValueError("kv_events_config: KV events need one KV cache group (the engine turns the groups off)")
