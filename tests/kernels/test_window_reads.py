"""Sliding-window layers read only the pages inside their queries' windows, in every backend.

The scheduler frees a sliding layer's pages once they fall wholly outside the window and leaves the null block in the
table there, so a kernel that read them would read another request's data. Here the table entries before each
sequence's first window page point at a page of NaNs: a backend that loaded any of it (masked or not: NaN * 0 is NaN)
would put NaNs in its output. Windows of page - 1, page, page + 1 tokens and of several pages; decodes whose window
starts inside a page and on a page boundary, prefill chunks whose rows' windows start on different pages, a fresh
prefill and a sequence shorter than its window, in one mixed step (the TPU runs its decode and tile kernels on it).
"""

import functools

import numpy as np
import pytest

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention
from pallas_kernels.ragged_paged_attention.example_batch import RaggedBatch, make_ragged_batch
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec
from tests.kernels.conftest import jit_one_shot

PAGE = 16
WINDOWS = [PAGE - 1, PAGE, PAGE + 1, 3 * PAGE + 5]
# Decodes first (the TPU's decode kernel takes the leading ones), then prefill chunks straddling a window start, a
# fresh prefill, and a decode shorter than every window.
Q_LENS = [1, 1, 6, 20, 7, 1]
KV_LENS = [5 * PAGE + 3, 7 * PAGE, 6 * PAGE + 2, 9 * PAGE + 4, 7, 9]


def batch_with_freed_pages(window: int) -> RaggedBatch:
    """The mixed step, its table entries before each sequence's first window page pointing at a page of NaNs."""
    batch = make_ragged_batch(Q_LENS, KV_LENS, num_q_heads=4, num_kv_heads=2, head_dim=64, page_size=PAGE,
                              num_tokens=48, max_num_seqs=8, pages_per_seq=12,
                              num_pages=sum(-(-n // PAGE) for n in KV_LENS) + 2, seed=11)
    tables, kv_pages = batch.block_tables.copy(), batch.kv_pages.copy()
    unused = sorted(set(range(1, kv_pages.shape[0])) - set(tables.reshape(-1).tolist()))
    freed = unused[0]
    kv_pages[freed] = np.nan
    for s, (q_len, kv_len) in enumerate(zip(Q_LENS, KV_LENS)):
        first_window_page = max(kv_len - q_len - window + 1, 0) // PAGE
        tables[s, :first_window_page] = freed
    assert np.sum(tables == freed) >= len(Q_LENS) - 2  # every long sequence lost pages at every window
    return RaggedBatch(q=batch.q, kv_pages=kv_pages, kv_lens=batch.kv_lens, block_tables=tables,
                       cu_q_lens=batch.cu_q_lens, num_seqs=batch.num_seqs, slot_mapping=batch.slot_mapping)


def _interpreted_in_ci(window: int) -> list:
    """The Pallas kernels run interpreted (seconds a compile): page - 1 and several pages in CI, every window in the
    slow sweep."""
    marks = [] if window in (PAGE - 1, 3 * PAGE + 5) else [pytest.mark.slow]
    return [pytest.param(backend, False, window, id=f"{backend}-{window}", marks=marks)
            for backend in ("pallas_tpu", "pallas_gpu")]


@pytest.mark.parametrize("backend,native,window", [
    *(pytest.param("xla", native, window, id=f"xla-{'native' if native else 'jnp'}-{window}")
      for native in (True, False) for window in WINDOWS),
    *(param for window in WINDOWS for param in _interpreted_in_ci(window))])
def test_no_page_before_the_window_is_read(backend, native, window):
    """Each backend equals the spec (finite everywhere) though the pages before every window are NaN."""
    batch = batch_with_freed_pages(window)
    args = batch.attention_args()
    expected = ragged_paged_attention_spec(*args, sm_scale=0.125, sliding_window=window)
    assert np.all(np.isfinite(expected))
    attend = jit_one_shot(functools.partial(ragged_paged_attention, backend=backend, sm_scale=0.125,
                                            sliding_window=window, native_decode=native))
    out = np.asarray(attend(*args), np.float64)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)
