"""The prefix-hit rule over KV cache groups (vLLM's hybrid KV cache coordinator), whatever holds the blocks.

A hit of L blocks needs blocks 0..L-1 in every full group, and in a sliding group (window w) only the blocks that
the window of the first computed token (position L * block_size) reaches back into. The longest such L is found
right to left in each sliding group (vLLM's rule), repeated until no group shortens it. The rule is the same
whether a block is on the device or in a KV tier below it (kv_cache_groups.py asks it once for the device alone,
once for the device and the tiers together).
"""

from collections.abc import Callable, Sequence
from typing import Optional

HeldBlock = Callable[[int, int], bool]
"""(group, block index) -> whether the block of that group is held (on the device, or below it)."""


def sliding_blocks_skipped(num_computed_tokens: int, window: int, block_size: int) -> int:
    """Leading blocks no query from position num_computed_tokens on reads in a window of `window` tokens: a query
    at position q reads positions q - window + 1 .. q."""
    return max(num_computed_tokens - window + 1, 0) // block_size


def first_needed_block(window: Optional[int], num_hit_blocks: int, block_size: int) -> int:
    """The first block a group needs for a hit of num_hit_blocks blocks: 0 for a full group."""
    return 0 if window is None else sliding_blocks_skipped(num_hit_blocks * block_size, window, block_size)


def longest_group_hit(group_windows: Sequence[Optional[int]], block_size: int, num_blocks: int,
                      held: HeldBlock) -> int:
    """The most blocks, at most num_blocks, of a hit that every group holds by its rule."""
    for group, window in enumerate(group_windows):  # full groups: the chain from the start
        if window is None:
            num_blocks = next((index for index in range(num_blocks) if not held(group, index)), num_blocks)
    while True:  # sliding groups shorten it until every one of them holds its window of the hit
        shortened = num_blocks
        for group, window in enumerate(group_windows):
            if window is not None:
                shortened = _sliding_hit(group, window, block_size, shortened, held)
        if shortened == num_blocks:
            return num_blocks
        num_blocks = shortened


def _sliding_hit(group: int, window: int, block_size: int, num_blocks: int, held: HeldBlock) -> int:
    """The most blocks, at most num_blocks, that a hit may cover in a sliding group: the blocks from the one the
    first computed token's window starts in up to the hit's end must be held. Scans right to left."""
    while num_blocks > 0:
        first = sliding_blocks_skipped(num_blocks * block_size, window, block_size)
        missing = next((index for index in range(num_blocks - 1, first - 1, -1) if not held(group, index)), None)
        if missing is None:
            return num_blocks
        num_blocks = missing
    return 0
