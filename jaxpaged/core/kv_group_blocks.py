"""How many blocks one sequence holds over the KV cache groups (kv_cache_groups.py), for admission and for the
memory plan's "N sequences of max_model_len fit": all of its blocks in a full group, its window's in a sliding one."""

from collections.abc import Sequence
from typing import Optional


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
