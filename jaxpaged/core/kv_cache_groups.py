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
shortens it (kv_group_hits.py). Token-granular hits copy the next, partly matching block in every group (the
shortest run of them).

The KV tiers and KV events work per group: a group's blocks go down to the tiers and come back under the same
(group, chain hash) keys (kv_group_keys.py), a hit that continues below the device follows the same rule, and the
sliding blocks the window left behind are offloaded only where a repeated prompt would read them
(kv_group_tiers.py); each KV event names the chain hash and its group, as vLLM's do.
"""

from collections.abc import Callable, Sequence
from typing import Optional

from .block_pool import NULL_BLOCK_ID
from .free_block_queue import KVCacheBlock
from .hashing import BlockHash, block_extra_keys, request_block_hash, request_parent_key
from .kv_cache_manager import KVCacheManager, PrefixHit
from .kv_events import KVEventLog
from .kv_group_blocks import max_sequence_tokens, sequence_blocks
from .kv_group_hits import first_needed_block, longest_group_hit, sliding_blocks_skipped
from .kv_group_keys import GroupedKVEventLog, group_key
from .kv_group_tiers import AdmittedHit, GroupTierLoads, TierLoad
from .lower_tiers import LowerTiers
from .request import Request
from .tier_events import BlockRecord

__all__ = ["GroupedKVCacheManager", "group_key", "max_sequence_tokens", "sequence_blocks", "sliding_blocks_skipped"]


class GroupedKVCacheManager(KVCacheManager):
    """Allocates, caches and frees blocks per KV layer group; answers prefix-cache lookups over every group, on the
    device and in the KV tiers below it."""

    def __init__(self, num_kv_blocks: int, block_size: int, group_windows: Sequence[Optional[int]],
                 enable_prefix_caching: bool = True, token_granular: bool = True,
                 lower_tiers: Optional[LowerTiers] = None) -> None:
        super().__init__(num_kv_blocks, block_size, enable_prefix_caching, token_granular, lower_tiers)
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
        self._tier_loads = GroupTierLoads(self.lower_tiers) if self.lower_tiers is not None else None
        """The KV tiers' reads, pending loads and the sliding blocks not worth offloading (kv_group_tiers.py)."""

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
        """The longest prefix every group holds on the device (never the whole request), then, token-granular, the
        longest run of the next tokens that a listed block after the same chain holds in every group. With the KV
        tiers on, the longest prefix every group holds on the device or below it instead, when it is at least
        min_load_blocks blocks longer."""
        if not self.enable_prefix_caching or request.computes_whole_prompt:
            return PrefixHit([], 0)
        keys = self._hit_keys(request)
        cached = self.block_pool.get_cached_block
        hit = self._hit(request, keys, lambda group, index: cached(keys[group][index]) is not None)
        tiers = self.lower_tiers
        if tiers is None:
            return hit
        below = self._hit(request, keys, lambda group, index: (cached(keys[group][index]) is not None
                                                               or tiers.holds(keys[group][index])))
        if below.group_loads and below.num_blocks - hit.num_blocks >= self.min_load_blocks:
            return below
        return hit

    def _hit_keys(self, request: Request) -> list[list[BlockHash]]:
        """Per group, the keys of the request's full blocks that a hit may cover (all but its last token's)."""
        block_size = self.block_size
        hashes = [request_block_hash(request, index, block_size) for index in range((request.num_tokens - 1)
                                                                                   // block_size)]
        return [[group_key(group, block_hash) for block_hash in hashes] for group in range(self.num_groups)]

    def _hit(self, request: Request, keys: list[list[BlockHash]], held: Callable[[int, int], bool]) -> PrefixHit:
        """The longest hit of blocks `held` says are there (device blocks are shared, the rest loaded from a tier),
        then the token-granular run after it."""
        block_size = self.block_size
        cached = self.block_pool.get_cached_block
        num_blocks = longest_group_hit(self.group_windows, block_size, len(keys[0]), held)
        num_hit_tokens = num_blocks * block_size
        group_ids, loads = [], []
        for group, window in enumerate(self.group_windows):
            first = first_needed_block(window, num_blocks, block_size)
            block_ids = []
            for index in range(num_blocks):
                block = cached(keys[group][index]) if index >= first else None
                if block is None and index >= first:
                    loads.append((group, index))
                block_ids.append(NULL_BLOCK_ID if block is None else block.block_id)
            group_ids.append(tuple(block_ids))
        tier_keys = tuple(keys[group][index] for group, index in loads)
        group_ids = tuple(group_ids)
        num_wanted = min(block_size, request.num_tokens - 1 - num_hit_tokens)
        if self.token_granular and num_wanted > 0:
            parent_key = request_parent_key(request, num_blocks, block_size)
            wanted = request.all_token_ids[num_hit_tokens:num_hit_tokens + num_wanted]
            sources, run = [], num_wanted
            for group in range(self.num_groups):
                source, group_run = self.block_pool.longest_partial_match(group_key(group, parent_key), wanted)
                if source is None:
                    run = 0
                    break
                sources.append(source.block_id)
                run = min(run, group_run)
            if run > 0:
                return PrefixHit(list(group_ids[0]), num_hit_tokens + run, sources[0], run, tier_keys,
                                 group_block_ids=group_ids, group_copy_sources=tuple(sources),
                                 group_loads=tuple(loads))
        return PrefixHit(list(group_ids[0]), num_hit_tokens, lower_tier_hashes=tier_keys, group_block_ids=group_ids,
                         group_loads=tuple(loads))

    # ---- allocation ----

    def allocate_hit(self, request: Request, num_new_tokens: int, hit: PrefixHit) -> Optional[list[int]]:
        """A waiting request's hit blocks and the blocks of its first num_new_tokens tokens after the hit, in every
        group; None, changing nothing, when the free blocks do not suffice. A hit's lower-tier blocks are read
        first; if one is gone or damaged, the device's hit is allocated instead, up to the same last token."""
        loads: tuple[TierLoad, ...] = ()
        from_tiers = bool(hit.group_loads)
        if from_tiers:
            assert self._tier_loads is not None  # only the tiers' hits have loads
            payloads = self._tier_loads.fetch(request.request_id, hit.lower_tier_hashes)
            if payloads is None:
                keys = self._hit_keys(request)
                cached = self.block_pool.get_cached_block
                device = self._hit(request, keys, lambda group, index: cached(keys[group][index]) is not None)
                device = device if hit.copy_source is not None else device.without_copy()
                num_new_tokens += hit.num_tokens - device.num_tokens
                hit = device
            else:
                loads = tuple(TierLoad(group, index, key, payload) for (group, index), key, payload
                              in zip(hit.group_loads, hit.lower_tier_hashes, payloads))
        new_block_ids = self._grow(request, num_new_tokens, hit, loads)
        if new_block_ids is not None and from_tiers:
            assert self._tier_loads is not None
            self._tier_loads.forget_fetch()
            self._tier_loads.admitted[request.request_id] = AdmittedHit(hit.num_tokens, loads)
        return new_block_ids

    def load_lower_tier_blocks(self, request: Request, hit: PrefixHit) -> int:
        """Queue the admitted hit's lower-tier blocks for the step's loads (read by allocate_hit) and make them
        hittable; the hit tokens that hold."""
        assert self._tier_loads is not None  # only the tiers' hits come here
        admitted = self._tier_loads.admitted.pop(request.request_id)
        tables = self._tables[request.request_id]
        for load in admitted.loads:
            block_id = tables[load.group][load.block_index]
            self._pending_loads.append((block_id, load.key, load.payload))
            self._cache_group_block(request, load.group, block_id, load.block_index)
        return admitted.num_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int, computed_block_ids: Sequence[int] = (),
                       copy_source: Optional[int] = None, num_copied_tokens: int = 0,
                       num_loaded_blocks: int = 0) -> Optional[list[int]]:
        """Grow every group's table to hold num_new_tokens more tokens (hits come through allocate_hit); the newly
        allocated block ids, or None, changing nothing but the release of blocks out of the window, when the free
        blocks do not suffice."""
        if computed_block_ids or copy_source is not None or num_loaded_blocks:
            raise ValueError("computed_block_ids: grouped prefix hits go through allocate_hit")
        return self._grow(request, num_new_tokens, None)

    def _grow(self, request: Request, num_new_tokens: int, hit: Optional[PrefixHit],
              loads: Sequence[TierLoad] = ()) -> Optional[list[int]]:
        block_size = self.block_size
        pool = self.block_pool
        request_id = request.request_id
        start = request.num_computed_tokens + (hit.num_tokens if hit is not None else 0)
        num_blocks_after = -(-(start + num_new_tokens) // block_size)
        tables = self._tables.get(request_id)
        if tables is not None:
            self._release_out_of_window(request, tables, start)
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
        num_needed = sum(max(count, 0) for count in needed) + len(loads)
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
            if self._tier_loads is not None:
                self._tier_loads.unneeded.difference_update(block.block_hash for block in held)
        new_block_ids = [block.block_id for block in pool.get_new_blocks(num_needed)]
        for load, block_id in zip(loads, new_block_ids):  # the loads' blocks first, into their hit positions
            hit_tables[load.group][load.block_index] = block_id
        if hit_tables[0] or loads:
            for group, ids in enumerate(hit_tables):
                tables[group].extend(ids)
                self._num_cached[request_id][group] = len(ids)
                self._num_skipped[request_id][group] = next(
                    (index for index, block_id in enumerate(ids) if block_id != NULL_BLOCK_ID), len(ids))
        taken = len(loads)
        for group, count in enumerate(needed):
            group_new = new_block_ids[taken:taken + max(count, 0)]
            taken += len(group_new)
            if hit is not None and hit.group_copy_sources:
                self._block_copies.append((hit.group_copy_sources[group], group_new[0]))
                self._held_copy_sources.append(pool.blocks[hit.group_copy_sources[group]])
            tables[group].extend(group_new)
        return new_block_ids

    def _release_out_of_window(self, request: Request, tables: list[list[int]], start: int) -> None:
        """Give back each sliding group's blocks that no query from position `start` on reads (tail first, so a
        cached chain is evicted from its end); their entries become the null block, in a new list (the runner's
        host block table mirrors lists by identity). With the KV tiers on, those the window of the prompt's end
        (a hit of its full blocks) does not read are marked not worth offloading (kv_group_tiers.py)."""
        request_id = request.request_id
        skipped = self._num_skipped[request_id]
        blocks = self.block_pool.blocks
        num_prompt_blocks = (request.num_prompt_tokens - 1) // self.block_size
        for group, window in enumerate(self.group_windows):
            if window is None:
                continue
            table = tables[group]
            first_kept = min(sliding_blocks_skipped(start, window, self.block_size), len(table))
            if first_kept <= skipped[group]:
                continue
            freed = [block_id for block_id in table[skipped[group]:first_kept] if block_id != NULL_BLOCK_ID]
            if self._tier_loads is not None:
                prompt_window = range(first_needed_block(window, num_prompt_blocks, self.block_size),
                                      num_prompt_blocks)
                self._tier_loads.unneeded.update(
                    key for index in range(skipped[group], first_kept)
                    if index not in prompt_window and (block_id := table[index]) != NULL_BLOCK_ID
                    and (key := blocks[block_id].block_hash) is not None)
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
        """Register one full, computed (or being loaded) block of one group under (group, chain hash); with KV
        events on, record its BlockStored (and keep its fields for the tiers' events)."""
        block_size = self.block_size
        start = block_index * block_size
        token_ids = tuple(request.all_token_ids[start:start + block_size])
        listing = ((group_key(group, request_parent_key(request, block_index, block_size)), token_ids)
                   if self.token_granular else (None, ()))
        key = group_key(group, request_block_hash(request, block_index, block_size))
        events = self.block_pool.events
        if self.block_pool.cache_block(self.block_pool.blocks[block_id], key, *listing) and events is not None:
            parent = request_block_hash(request, block_index - 1, block_size) if block_index else None
            record = BlockRecord(parent, token_ids, block_extra_keys(request, block_index))
            events.stored(key, record.parent_block_hash, record.token_ids, record.extra_keys)
            if self._tier_events is not None:
                self._block_records[key] = record

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
            held = [blocks[block_id] for block_id in reversed(table) if block_id != NULL_BLOCK_ID]
            if self._tier_loads is not None:  # a request's last window is worth offloading
                self._tier_loads.unneeded.difference_update(block.block_hash for block in held)
            self.block_pool.free_blocks(held)

    # ---- the KV tiers and KV events ----

    def take_tier_transfers(self) -> tuple[list[tuple[int, BlockHash]], list[tuple[int, object]]]:
        """The base class's saves and loads, the evicted sliding blocks not worth offloading left out."""
        if self._tier_loads is not None and self.block_pool.evictions:
            kept = self._tier_loads.worth_offloading(self.block_pool.evictions)
            for key in {key for _, key in self.block_pool.evictions} - {key for _, key in kept}:
                self._block_records.pop(key, None)
            self.block_pool.evictions = kept
        return super().take_tier_transfers()

    def blocks_worth_persisting(self) -> list[tuple[int, BlockHash]]:
        """cached_blocks() less the sliding blocks not worth offloading."""
        unneeded = self._tier_loads.unneeded if self._tier_loads is not None else set()
        return [(block_id, key) for block_id, key in self.cached_blocks() if key not in unneeded]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request holds a block."""
        if not super().reset_prefix_cache():
            return False
        if self._tier_loads is not None:
            self._tier_loads.unneeded.clear()
        return True

    def record_kv_events(self) -> KVEventLog:
        """Start recording what the prefix cache stores, evicts and clears, each event naming its group (vLLM's
        group_idx, kv_cache_spec_kind and kv_cache_spec_sliding_window); the log to drain."""
        if self.block_pool.events is None:
            self.block_pool.events = GroupedKVEventLog(self.block_size, self.group_windows)
        return self.block_pool.events
