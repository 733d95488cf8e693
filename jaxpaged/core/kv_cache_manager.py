"""KVCacheManager: each request's block table on top of the BlockPool, and the prefix cache lookups into it.

Block ids, not block objects, cross this class's boundary: the scheduler and the runner only need ids.

Token-granular hits: after the chain of full-block hits, the next block of the request usually misses (its
tokens diverge part-way). The lookup then finds, among the cached blocks and finished requests' tails that
follow the same chain, the one sharing the longest leading run of tokens; the request's first new block starts
as a device copy of it (copy-on-write: the source stays shared and unchanged) and the request computes only
after the run. A 1,000-token shared prefix on 16-token blocks so reuses 1,000 tokens, not 992.

Lower tiers (host memory, disk; core/lower_tiers.py): a chain that the device pool no longer holds may go on
below it. Those blocks are loaded into freshly allocated blocks before the step that reads them, and what the
pool evicts is offloaded before the step that reuses the block; take_tier_transfers() hands both to the step.
"""

import dataclasses
from collections.abc import Sequence
from typing import Optional

from .block_pool import BlockPool
from .free_block_queue import KVCacheBlock
from .hashing import BlockHash, block_extra_keys, request_block_hash, request_parent_key
from .kv_events import KVEventLog
from .lower_tiers import LowerTiers
from .request import Request
from .tier_events import BlockRecord, TierEventRecorder


@dataclasses.dataclass(frozen=True, slots=True)
class PrefixHit:
    """What the prefix cache holds of a request: whole blocks to share, then a run of tokens to copy."""

    block_ids: list[int]
    """Full blocks the request shares (its block table starts with them)."""
    num_tokens: int
    """Hit tokens in all: len(block_ids) * block_size + num_copied_tokens."""
    copy_source: Optional[int] = None
    """The block whose first num_copied_tokens slots the request's next block copies, if any."""
    num_copied_tokens: int = 0
    """Tokens the copy brings (0 < n < block_size when copy_source is set)."""
    lower_tier_hashes: tuple[BlockHash, ...] = ()
    """Chain hashes of the full blocks after block_ids that a lower tier holds (loaded, then shared)."""
    group_block_ids: tuple[tuple[int, ...], ...] = ()
    """KV layer groups (kv_cache_groups.py): each group's hit blocks (block_ids is group 0's); () with one group."""
    group_copy_sources: tuple[int, ...] = ()
    """KV layer groups: each group's copy source, when the hit copies (copy_source is group 0's)."""
    group_loads: tuple[tuple[int, int], ...] = ()
    """KV layer groups: (group, block index) of each block a lower tier holds, in lower_tier_hashes' order (their
    entries in group_block_ids are the null block until allocation gives them a block to load into)."""

    @property
    def num_blocks(self) -> int:
        """Full blocks of the hit, on the device and below it."""
        if self.group_block_ids:
            return len(self.group_block_ids[0])
        return len(self.block_ids) + len(self.lower_tier_hashes)

    def without_copy(self) -> "PrefixHit":
        """The same hit ending at its last full block (the copied tokens are computed instead)."""
        return dataclasses.replace(self, num_tokens=self.num_tokens - self.num_copied_tokens, copy_source=None,
                                   num_copied_tokens=0, group_copy_sources=())



class KVCacheManager:
    """Allocates, caches and frees the blocks of requests; answers prefix-cache lookups."""

    def __init__(self, num_kv_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 token_granular: bool = True, lower_tiers: Optional[LowerTiers] = None) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be a positive int, got {block_size!r}")
        self.block_size = block_size
        """Tokens per block."""
        self.enable_prefix_caching = enable_prefix_caching
        """Whether computed full blocks are shared across requests."""
        self.token_granular = token_granular and enable_prefix_caching
        """Whether hits extend past the last full block by copying a partly matching block."""
        self.block_pool = BlockPool(num_kv_blocks, enable_caching=enable_prefix_caching)
        """The blocks themselves."""
        self.prefix_cache_queries = 0
        """Cumulative tokens of admitted requests looked up in the prefix cache."""
        self.prefix_cache_hits = 0
        """Cumulative tokens of those served from the prefix cache."""
        self._block_ids: dict[str, list[int]] = {}
        # How many leading blocks of each request are already registered in the prefix cache.
        self._num_cached_blocks: dict[str, int] = {}
        # Copies (source, destination) the next step must make before it runs, and the sources held until then.
        self._block_copies: list[tuple[int, int]] = []
        self._held_copy_sources: list[KVCacheBlock] = []
        self.lower_tiers = lower_tiers if enable_prefix_caching else None
        """Host and disk tiers below the pool, if any."""
        self.min_load_blocks = 1
        """Fewer lower-tier hit blocks than this are recomputed instead: loading them would be slower (the
        engine measures it at start-up)."""
        # (destination block, chain hash, payload) loads the next step makes first.
        self._pending_loads: list[tuple[int, BlockHash, object]] = []
        if self.lower_tiers is not None:
            self.block_pool.evictions = []
        # With the tiers' KV events on: each cached block's event fields, handed to the recorder when it is evicted
        # towards the tiers (they keep only hashes).
        self._tier_events: Optional[TierEventRecorder] = None
        self._block_records: dict[BlockHash, BlockRecord] = {}

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
        if not self.enable_prefix_caching or request.computes_whole_prompt:
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

    def find_prefix_hit(self, request: Request) -> PrefixHit:
        """get_computed_blocks(), then the chain's next full blocks that a lower tier holds, then, when
        token-granular, the longest run of the next tokens that a cached block (or a finished request's tail) after
        the same chain holds. Still never the whole request."""
        hit_block_ids, num_hit_tokens = self.get_computed_blocks(request)
        block_size = self.block_size
        lower_tier_hashes = self._lower_tier_run(request, len(hit_block_ids))
        num_hit_blocks = len(hit_block_ids) + len(lower_tier_hashes)
        num_hit_tokens = num_hit_blocks * block_size
        num_wanted = min(block_size, request.num_tokens - 1 - num_hit_tokens)
        if self.token_granular and not request.computes_whole_prompt and num_wanted > 0:
            parent_key = request_parent_key(request, num_hit_blocks, block_size)
            wanted = request.all_token_ids[num_hit_tokens:num_hit_tokens + num_wanted]
            source, run = self.block_pool.longest_partial_match(parent_key, wanted)
            if source is not None:
                return PrefixHit(hit_block_ids, num_hit_tokens + run, source.block_id, run, lower_tier_hashes)
        return PrefixHit(hit_block_ids, num_hit_tokens, lower_tier_hashes=lower_tier_hashes)

    def _lower_tier_run(self, request: Request, first_block: int) -> tuple[BlockHash, ...]:
        """Hashes of the request's full blocks from first_block on that a lower tier holds, up to the first it
        does not; () when shorter than min_load_blocks."""
        tiers = self.lower_tiers
        if tiers is None or request.computes_whole_prompt:
            return ()
        hashes = []
        for block_index in range(first_block, (request.num_tokens - 1) // self.block_size):
            block_hash = request_block_hash(request, block_index, self.block_size)
            if not tiers.holds(block_hash):
                break
            hashes.append(block_hash)
        return tuple(hashes) if len(hashes) >= self.min_load_blocks else ()

    def record_prefix_lookup(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup in the prefix-cache counters."""
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_query_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int, computed_block_ids: Sequence[int] = (),
                       copy_source: Optional[int] = None, num_copied_tokens: int = 0,
                       num_loaded_blocks: int = 0) -> Optional[list[int]]:
        """Grow the request's block table to hold num_new_tokens more tokens; the newly allocated block ids.

        computed_block_ids are prefix-cache hits (from find_prefix_hit) that join the table first; then the first
        num_loaded_blocks new blocks, for the lower-tier hits (load_lower_tier_blocks() fills them); then, with a
        copy_source, num_copied_tokens hit tokens that the next new block copies from it (queued for
        take_block_copies()); the new tokens follow. Returns None, changing nothing, when the free blocks do
        not suffice.
        """
        block_size = self.block_size
        block_ids = self._block_ids.get(request.request_id)
        num_held_blocks = len(block_ids) if block_ids is not None else 0
        num_tokens_after = (request.num_computed_tokens + (len(computed_block_ids) + num_loaded_blocks) * block_size
                            + num_copied_tokens + num_new_tokens)
        num_new_blocks = -(-num_tokens_after // block_size) - num_held_blocks - len(computed_block_ids)
        if num_new_blocks <= 0 and not computed_block_ids and copy_source is None:
            return []  # the common decode step: the last block still has room
        pool = self.block_pool
        held_blocks = [pool.blocks[block_id] for block_id in computed_block_ids]
        if copy_source is not None:
            held_blocks.append(pool.blocks[copy_source])
        # Hit blocks nobody holds sit in the free queue: taking them shrinks what is left to allocate from.
        num_free_hit_blocks = sum(1 for block in held_blocks if block.ref_cnt == 0)
        if num_new_blocks > pool.num_free_blocks - num_free_hit_blocks:
            return None
        if block_ids is None:
            block_ids = self._block_ids[request.request_id] = []
            self._num_cached_blocks[request.request_id] = 0
        if held_blocks:
            # Touch before allocating, so allocation cannot evict the hit blocks (nor the copy's source).
            pool.touch(held_blocks)
            block_ids.extend(computed_block_ids)
            self._num_cached_blocks[request.request_id] = len(block_ids)
        new_block_ids = [block.block_id for block in pool.get_new_blocks(max(num_new_blocks, 0))]
        if copy_source is not None:
            self._block_copies.append((copy_source, new_block_ids[num_loaded_blocks]))
            self._held_copy_sources.append(held_blocks[-1])
        block_ids.extend(new_block_ids)
        return new_block_ids

    def allocate_hit(self, request: Request, num_new_tokens: int, hit: PrefixHit) -> Optional[list[int]]:
        """allocate_slots() of a waiting request at its prefix hit (find_prefix_hit's)."""
        return self.allocate_slots(request, num_new_tokens, hit.block_ids, hit.copy_source, hit.num_copied_tokens,
                                   len(hit.lower_tier_hashes))

    def blocks_for_tokens(self, num_tokens: int, num_chunk_tokens: int = 0) -> int:
        """Blocks one request of num_tokens tokens holds at most (num_chunk_tokens: its longest step)."""
        del num_chunk_tokens  # every block is kept
        return -(-num_tokens // self.block_size)

    @property
    def num_groups(self) -> int:
        """Block tables per request (KV layer groups): one here."""
        return 1

    def get_group_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table of every KV layer group: one group here."""
        return (self.get_block_ids(request_id),)

    def take_block_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies queued since the last call, which the step about to run must
        make before anything else; the sources are released (the step's copies read them before any later
        allocation can reuse them)."""
        copies, self._block_copies = self._block_copies, []
        if self._held_copy_sources:
            self.block_pool.free_blocks(self._held_copy_sources)
            self._held_copy_sources = []
        return copies

    def load_lower_tier_blocks(self, request: Request, hit: PrefixHit) -> int:
        """Fetch the hit's lower-tier blocks into the blocks allocate_slots() gave them (queued for the step's
        loads; they are hittable at once); returns the hit tokens that hold.

        A block that is gone or fails its checksum ends the hit there: the rest, and any copy queued after it, is
        computed instead (the blocks already allocated cover that, as the hit only shrinks).
        """
        tiers = self.lower_tiers
        assert tiers is not None  # only lower-tier hits come here
        block_ids = self._block_ids[request.request_id]
        first = len(hit.block_ids)
        num_loaded = 0
        for offset, block_hash in enumerate(hit.lower_tier_hashes):
            payload = tiers.fetch(block_hash)
            if payload is None:
                break
            block_index = first + offset
            self._pending_loads.append((block_ids[block_index], block_hash, payload))
            self._cache_block(request, block_index)
            num_loaded += 1
        self._num_cached_blocks[request.request_id] = first + num_loaded
        if num_loaded == len(hit.lower_tier_hashes):
            return hit.num_tokens
        if hit.copy_source is not None:  # queued last by allocate_slots; it would copy after a missing block
            self._block_copies.pop()
            self.block_pool.free_blocks([self._held_copy_sources.pop()])
        return (first + num_loaded) * self.block_size

    def take_tier_transfers(self) -> tuple[list[tuple[int, BlockHash]], list[tuple[int, object]]]:
        """What the step about to run moves between the pool and the lower tiers, in this order: saves
        (block id, chain hash) of cached blocks allocation evicted, whose K/V must be copied down before the step
        overwrites them, then loads (block id, payload). A block some tier already holds is not copied again."""
        pending, self._pending_loads = self._pending_loads, []
        loads = [(block_id, payload) for block_id, _, payload in pending]
        evictions = self.block_pool.evictions
        tiers = self.lower_tiers
        if not evictions or tiers is None:
            return [], loads
        self.block_pool.evictions = []
        if self._tier_events is not None:
            for _, block_hash in evictions:
                self._tier_events.remember(block_hash, self._block_records.pop(block_hash, None))
        # NOTE: match on (block, hash), not on the block alone. An evicted block that became a load's destination
        # (the usual case: loads go into freshly allocated blocks, which allocation evicts) still holds the evicted
        # K/V when the step's saves gather it, as they are dispatched before the loads. Only a block loaded in this
        # very step and evicted again holds nothing of its hash on the device yet: its tier had it a moment ago.
        loaded = {(block_id, block_hash) for block_id, block_hash, _ in pending}
        saves = []
        for block_id, block_hash in evictions:
            if tiers.holds(block_hash):
                tiers.touch(block_hash)
            elif (block_id, block_hash) not in loaded:
                saves.append((block_id, block_hash))
        return saves, loads

    def cache_full_blocks(self, request: Request) -> None:
        """Make every full block of the request's computed tokens hittable (call once their K/V is written)."""
        if not self.enable_prefix_caching:
            return
        request_id = request.request_id
        num_full_blocks = request.num_computed_tokens // self.block_size
        num_cached_blocks = self._num_cached_blocks.get(request_id, num_full_blocks)
        if num_full_blocks <= num_cached_blocks:
            return
        for block_index in range(num_cached_blocks, num_full_blocks):
            self._cache_block(request, block_index)
        self._num_cached_blocks[request_id] = num_full_blocks

    def trim_blocks(self, request: Request) -> None:
        """Free the request's blocks past its computed tokens: a speculative step allocated room for proposals it
        then rejected, and num_computed_tokens was rolled back. The table becomes a new list: the runner's host
        block table mirrors lists by identity and length, and a shrunk list regrown to the same length in place
        would look unchanged to it."""
        block_ids = self._block_ids.get(request.request_id)
        if not block_ids:
            return
        num_needed = -(-request.num_computed_tokens // self.block_size)
        if len(block_ids) <= num_needed:
            return
        blocks = self.block_pool.blocks
        self.block_pool.free_unwritten_blocks(blocks[block_id] for block_id in reversed(block_ids[num_needed:]))
        self._block_ids[request.request_id] = block_ids[:num_needed]

    def _cache_block(self, request: Request, block_index: int) -> None:
        """Register the request's full block block_index (its K/V written or being loaded) in the prefix cache."""
        block_size = self.block_size
        start = block_index * block_size
        # Token-granular lookups also find the block by what precedes it, and compare its tokens.
        listing = ((request_parent_key(request, block_index, block_size),
                    tuple(request.all_token_ids[start:start + block_size])) if self.token_granular else (None, ()))
        block = self.block_pool.blocks[self._block_ids[request.request_id][block_index]]
        block_hash = request_block_hash(request, block_index, block_size)
        events = self.block_pool.events
        if self.block_pool.cache_block(block, block_hash, *listing) and events is not None:
            parent = request_block_hash(request, block_index - 1, block_size) if block_index else None
            record = BlockRecord(parent, tuple(request.all_token_ids[start:start + block_size]),
                                 block_extra_keys(request, block_index))
            events.stored(block_hash, record.parent_block_hash, record.token_ids, record.extra_keys)
            if self._tier_events is not None:
                self._block_records[block_hash] = record

    def record_kv_events(self) -> KVEventLog:
        """Start recording what the prefix cache stores, evicts and clears (KV events); the log to drain."""
        if self.block_pool.events is None:
            self.block_pool.events = KVEventLog(self.block_size)
        return self.block_pool.events

    def record_tier_events(self, recorder: TierEventRecorder) -> None:
        """Also hand the event fields of blocks evicted towards the lower tiers to `recorder` (call after
        record_kv_events(), before anything is cached)."""
        self._tier_events = recorder

    def hand_down_record(self, block_hash: BlockHash) -> None:
        """The block goes down to a tier while the pool keeps it (a shutdown persisting the cache): give the tiers'
        events its fields."""
        if self._tier_events is not None:
            self._tier_events.remember(block_hash, self._block_records.get(block_hash))

    def free(self, request: Request, tail_is_computed: bool = True) -> None:
        """Release all of the request's blocks, tail first, so a chain is evicted from its end.

        tail_is_computed: every one of the request's num_computed_tokens has its K/V written (not so for a
        request preempted after being scheduled in the step being planned). Then, token-granular, a partly
        filled last block stays listed as a copy source (a finished turn of a chat, say) until reallocated.
        """
        block_ids = self._block_ids.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        if not block_ids:
            return
        blocks = self.block_pool.blocks
        num_computed = request.num_computed_tokens
        tail_index, num_tail_tokens = divmod(num_computed, self.block_size)
        if self.token_granular and tail_is_computed and num_tail_tokens and tail_index < len(block_ids):
            start = tail_index * self.block_size
            self.block_pool.cache_partial_block(blocks[block_ids[tail_index]],
                                                request_parent_key(request, tail_index, self.block_size),
                                                tuple(request.all_token_ids[start:num_computed]))
        self.block_pool.free_blocks(blocks[block_id] for block_id in reversed(block_ids))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request holds a block."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self._block_records.clear()
        return True

    def blocks_worth_persisting(self) -> list[tuple[int, BlockHash]]:
        """The cached blocks a shutdown writes to the disk tier (cached_blocks(): every one here)."""
        return self.cached_blocks()

    def cached_blocks(self) -> list[tuple[int, BlockHash]]:
        """(block id, chain hash) of every cached block: free ones least recently used first, then held ones."""
        pool = self.block_pool
        free = [pool.blocks[block_id] for block_id in pool.free_block_ids()]
        held = [block for block in pool.blocks if block.ref_cnt > 0]
        return [(block.block_id, block.block_hash) for block in free + held if block.block_hash is not None]
