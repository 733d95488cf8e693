"""Data-parallel routing: which data-parallel rank (block pool + scheduler) a new request goes to.

A prefix cache per rank only pays if requests that share a prefix land on the same rank, so the rank with the
longest prefix for the request wins; ties go to the least loaded rank, then the lowest index. "Longest prefix"
counts both blocks a rank has cached and blocks of requests already routed there whose K/V is not computed yet
(the owner table), so a burst of requests with one system prompt all go where the first one went.
"""

import collections
from collections.abc import Callable, Sequence

from .hashing import BlockHash, request_block_hash
from .request import Request

# Owner-table entries kept (LRU): ~100 bytes each, so about 10 MB at most.
MAX_OWNED_BLOCKS = 100_000


class PrefixAwareRouter:
    """Chooses a rank per request from per-rank prefix hits and loads."""

    def __init__(self, num_ranks: int, block_size: int) -> None:
        self.num_ranks = num_ranks
        self.block_size = block_size
        self._owner: collections.OrderedDict[BlockHash, int] = collections.OrderedDict()

    def route(self, request: Request, cached_hit_tokens: Callable[[int, Request], int],
              loads: Sequence[int]) -> int:
        """The rank for `request`: most prefix tokens (cached or in flight there), then least load."""
        if self.num_ranks == 1:
            return 0
        num_full_blocks = (request.num_tokens - 1) // self.block_size
        hashes = [request_block_hash(request, index, self.block_size) for index in range(num_full_blocks)]
        owned = [0] * self.num_ranks
        for index, block_hash in enumerate(hashes):  # the chain: a rank owns a prefix up to its first gap
            rank = self._owner.get(block_hash)
            if rank is None or owned[rank] != index * self.block_size:
                break
            owned[rank] = (index + 1) * self.block_size
        scores = [max(owned[rank], cached_hit_tokens(rank, request)) for rank in range(self.num_ranks)]
        chosen = min(range(self.num_ranks), key=lambda rank: (-scores[rank], loads[rank], rank))
        for block_hash in hashes:
            self._owner[block_hash] = chosen
            self._owner.move_to_end(block_hash)
        while len(self._owner) > MAX_OWNED_BLOCKS:
            self._owner.popitem(last=False)
        return chosen
