"""Random ragged batches in the runner's layout, for kernel tests and benchmarks (host-side numpy)."""

import dataclasses
from collections.abc import Sequence
from typing import Optional

import jax
import numpy as np
from numpy.typing import DTypeLike

from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata


@dataclasses.dataclass(frozen=True)
class RaggedBatch:
    """One attention step's inputs, padded like the model runner pads them (numpy arrays)."""

    q: np.ndarray
    """[num_tokens, num_q_heads, head_dim] queries; padding rows are random too."""
    kv_pages: np.ndarray
    """[num_pages, page_size, 2 * num_kv_heads, head_dim]; page 0 (null) holds finite garbage."""
    kv_lens: np.ndarray
    """[max_num_seqs] int32 KV length after this step; 0 for padded sequences."""
    block_tables: np.ndarray
    """[max_num_seqs, pages_per_seq] int32 page ids; 0 past a sequence's pages."""
    cu_q_lens: np.ndarray
    """[max_num_seqs + 1] int32 q row offsets; padded sequences repeat the last value."""
    num_seqs: np.ndarray
    """[1] int32 number of real sequences."""
    slot_mapping: np.ndarray
    """[num_tokens] int32 KV slot of each q row (page_id * page_size + offset); null page for padding."""

    @property
    def metadata(self) -> AttentionMetadata:
        """The batch's AttentionMetadata (host numpy arrays)."""
        return AttentionMetadata(slot_mapping=self.slot_mapping, kv_lens=self.kv_lens,
                                 block_tables=self.block_tables, cu_q_lens=self.cu_q_lens,
                                 num_seqs=self.num_seqs)

    def attention_args(self) -> tuple:
        """(q, kv_pages, metadata) on the default device: the positional arguments of every backend."""
        return jax.device_put((self.q, self.kv_pages, self.metadata))


def make_ragged_batch(
    q_lens: Sequence[int],
    kv_lens: Sequence[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: DTypeLike = np.float32,
    num_tokens: Optional[int] = None,
    max_num_seqs: Optional[int] = None,
    pages_per_seq: Optional[int] = None,
    num_pages: Optional[int] = None,
    shuffle_pages: bool = True,
    seed: int = 0,
) -> RaggedBatch:
    """A batch where sequence s has q_lens[s] new tokens and kv_lens[s] KV tokens (new ones included)."""
    if len(q_lens) != len(kv_lens):
        raise ValueError(f"q_lens/kv_lens: lengths differ, got {len(q_lens)} and {len(kv_lens)}")
    for q_len, kv_len in zip(q_lens, kv_lens):
        if not 1 <= q_len <= kv_len:
            raise ValueError(f"q_lens: need 1 <= q_len <= kv_len, got q_len={q_len}, kv_len={kv_len}")
    rng = np.random.default_rng(seed)
    num_real_seqs = len(q_lens)
    pages_needed = [-(-kv_len // page_size) for kv_len in kv_lens]
    num_tokens = num_tokens if num_tokens is not None else sum(q_lens)
    max_num_seqs = max_num_seqs if max_num_seqs is not None else max(num_real_seqs, 1)
    pages_per_seq = pages_per_seq if pages_per_seq is not None else max(pages_needed + [1])
    num_pages = num_pages if num_pages is not None else sum(pages_needed) + 1
    if num_tokens < sum(q_lens) or max_num_seqs < num_real_seqs or pages_per_seq < max(
            pages_needed + [0]) or num_pages < sum(pages_needed) + 1:
        raise ValueError("make_ragged_batch: padded sizes smaller than the real batch")

    # Page 0 is the null page: never handed out. Shuffled ids make tables non-contiguous.
    free_pages = np.arange(1, num_pages)
    if shuffle_pages:
        free_pages = rng.permutation(free_pages)
    block_tables = np.zeros((max_num_seqs, pages_per_seq), np.int32)
    cu_q_lens = np.zeros(max_num_seqs + 1, np.int32)
    padded_kv_lens = np.zeros(max_num_seqs, np.int32)
    slot_mapping = np.zeros(num_tokens, np.int32)
    next_page = 0
    for s, (q_len, kv_len, num_seq_pages) in enumerate(zip(q_lens, kv_lens, pages_needed)):
        block_tables[s, :num_seq_pages] = free_pages[next_page:next_page + num_seq_pages]
        next_page += num_seq_pages
        cu_q_lens[s + 1] = cu_q_lens[s] + q_len
        padded_kv_lens[s] = kv_len
        positions = np.arange(kv_len - q_len, kv_len)
        slot_mapping[cu_q_lens[s]:cu_q_lens[s + 1]] = (
            block_tables[s, positions // page_size] * page_size + positions % page_size)
    cu_q_lens[num_real_seqs + 1:] = cu_q_lens[num_real_seqs]

    q = rng.standard_normal((num_tokens, num_q_heads, head_dim), np.float32)
    kv_pages = rng.standard_normal((num_pages, page_size, 2 * num_kv_heads, head_dim), np.float32)
    kv_pages[0] = 50.0 * rng.standard_normal(kv_pages.shape[1:])  # loud garbage: must be masked
    return RaggedBatch(q=q.astype(dtype), kv_pages=kv_pages.astype(dtype),
                       kv_lens=padded_kv_lens, block_tables=block_tables, cu_q_lens=cu_q_lens,
                       num_seqs=np.array([num_real_seqs], np.int32), slot_mapping=slot_mapping)
