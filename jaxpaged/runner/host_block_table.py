"""HostBlockTable: the step's block table kept on the host between steps, rewritten only where it changed."""

from collections.abc import Sequence

import numpy as np
from jaxtyping import Int32


class HostBlockTable:
    """Rows of block ids, one per scheduled sequence, that persist from one step to the next.

    A running sequence keeps its row while the requests before it stay, and its block list only grows (the KV
    cache manager appends to it; a preempted or new request gets a new list). So a row remembers which live
    list it mirrors and how much of it is written: a decode step writes a block only when a sequence crosses
    into a new one. Converting every table anew costs tens of microseconds per step at 64 sequences (more after a
    device step has flushed the caches; figures in docs/performance.md).
    """

    def __init__(self, max_num_seqs: int, blocks_per_seq: int):
        self.table: Int32[np.ndarray, "max_num_seqs blocks_per_seq"] = np.zeros((max_num_seqs, blocks_per_seq),
                                                                                np.int32)
        self._mirrored: list[object] = [None] * max_num_seqs
        """The block-id list each row holds (compared by identity), None for an empty row."""
        self._num_written = [0] * max_num_seqs
        self._num_rows = 0
        """Rows in use after the last update; rows past it are all zeros."""

    def update(self, block_id_lists: Sequence[list[int]]) -> Int32[np.ndarray, "max_num_seqs blocks_per_seq"]:
        """Row i becomes block_id_lists[i] (zero-padded); the rows after them become zeros. Returns the table, a
        live view: copy it before the next update if it must stay as it is."""
        table, mirrored, num_written = self.table, self._mirrored, self._num_written
        blocks_per_seq = table.shape[1]
        for row, block_ids in enumerate(block_id_lists):
            num_blocks = len(block_ids)
            if num_blocks > blocks_per_seq:
                raise ValueError(f"block_ids: row {row} holds {num_blocks} blocks, the table {blocks_per_seq}")
            if mirrored[row] is not block_ids or num_blocks < num_written[row]:
                table[row, :num_blocks] = block_ids
                if num_written[row] > num_blocks:
                    table[row, num_blocks:num_written[row]] = 0
                mirrored[row] = block_ids
            elif num_blocks != num_written[row]:  # grown in place since the last step
                table[row, num_written[row]:num_blocks] = block_ids[num_written[row]:]
            num_written[row] = num_blocks
        num_rows = len(block_id_lists)
        if num_rows < self._num_rows:
            table[num_rows:self._num_rows] = 0
            for row in range(num_rows, self._num_rows):
                mirrored[row], num_written[row] = None, 0
        self._num_rows = num_rows
        return table
