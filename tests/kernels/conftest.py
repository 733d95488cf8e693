"""Shared pieces of the kernel tests: a dumb per-sequence numpy attention loop to check against."""

from typing import Optional

import numpy as np
import pytest


def naive_ragged_paged_attention(q, kv_pages, kv_lens, block_tables, cu_q_lens, num_seqs, *,
                                 sm_scale: float, sliding_window: Optional[int] = None,
                                 soft_cap: Optional[float] = None) -> np.ndarray:
    """Float64 loop over sequences, tokens and heads; rows of no real sequence come out as zeros."""
    q = np.asarray(q, np.float64)
    kv_pages = np.asarray(kv_pages, np.float64)
    num_tokens, num_q_heads, head_dim = q.shape
    page_size = kv_pages.shape[1]
    num_kv_heads = kv_pages.shape[2] // 2
    group_size = num_q_heads // num_kv_heads
    out = np.zeros_like(q)
    for s in range(int(np.asarray(num_seqs).reshape(-1)[0])):
        start, end = int(cu_q_lens[s]), int(cu_q_lens[s + 1])
        kv_len = int(kv_lens[s])
        pages = [int(block_tables[s, p // page_size]) for p in range(kv_len)]
        keys = np.stack([kv_pages[pages[p], p % page_size, 0::2] for p in range(kv_len)])
        values = np.stack([kv_pages[pages[p], p % page_size, 1::2] for p in range(kv_len)])
        for i in range(end - start):
            position = kv_len - (end - start) + i
            lo = 0 if sliding_window is None else max(0, position - sliding_window + 1)
            for head in range(num_q_heads):
                kv_head = head // group_size
                logits = keys[lo:position + 1, kv_head] @ q[start + i, head] * sm_scale
                if soft_cap is not None:
                    logits = soft_cap * np.tanh(logits / soft_cap)
                weights = np.exp(logits - logits.max())
                weights /= weights.sum()
                out[start + i, head] = weights @ values[lo:position + 1, kv_head]
    return out


@pytest.fixture(scope="session")
def naive_attention():
    """The naive per-sequence loop, as a fixture so every kernel test file can use it."""
    return naive_ragged_paged_attention
