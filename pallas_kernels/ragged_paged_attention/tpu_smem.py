"""The TPU kernels' SMEM budget: how many sequences' block-table rows one kernel call may scalar-prefetch."""

# Scalar-prefetch budget: half of the 1 MiB SMEM of v5e/v6e, the rest left to Mosaic's own use.
DEFAULT_SMEM_BUDGET_BYTES = 512 * 1024
_SMEM_ROUNDING = 128


def _smem_words(length: int) -> int:
    # Estimate: Mosaic pads each SMEM array; 128 words per array is the rounding assumed here.
    return -(-length // _SMEM_ROUNDING) * _SMEM_ROUNDING


def sequences_per_call(max_num_seqs: int, pages_per_seq: int, num_tiles: int, smem_budget_bytes: int) -> int:
    """How many sequences' block-table rows one kernel call may hold in SMEM (scalar prefetch).

    Both kernels prefetch kv_lens, the flattened block table and cu_q_lens (the tile kernel also two
    words per q tile). A step whose tables exceed the budget is run as several calls over sequence
    ranges instead of failing to compile (128k-token contexts at page 16 are 8k words per row).
    """
    fixed_words = _smem_words(2 * num_tiles) + 4 * _SMEM_ROUNDING  # tile ranges, num_seqs, rounding slack
    per_seq_words = pages_per_seq + 2
    fitting = (smem_budget_bytes // 4 - fixed_words) // per_seq_words
    if fitting < 1:
        raise ValueError(f"block_tables: one row of {pages_per_seq} pages needs more SMEM than "
                         f"smem_budget_bytes={smem_budget_bytes}; use bigger pages")
    return min(max_num_seqs, fitting)
