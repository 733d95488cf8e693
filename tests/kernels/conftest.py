"""Shared pieces of the kernel tests: a dumb per-sequence numpy attention loop to check against."""

import dataclasses
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


def ragged_scenarios(page_size: int, **shape) -> list:
    """Named batches that all share one padded shape, so a kernel compiles once for all of them.

    Covers decode-only, prefill-only (fresh and chunked), mixed, kv lengths 1, page-1, page,
    page+1 and many pages, padded rows and sequences, an all-padding step, shuffled page ids.
    """
    from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch

    p = page_size
    padded = dict(num_tokens=80, max_num_seqs=6, pages_per_seq=8, num_pages=24, page_size=p)
    cases = {
        "decode_edges": ([1, 1, 1, 1, 1], [1, p - 1, p, p + 1, 5 * p + 3]),
        "prefill": ([p + 1, 3, 5], [p + 1, 3, 3 * p + 2]),
        "mixed": ([1, 7, 1, 2 * p + 3], [4 * p + 1, 7, p, 3 * p]),
        "many_pages": ([1, 40], [8 * p, 40 + p]),
    }
    batches = [(name, make_ragged_batch(q_lens, kv_lens, seed=seed, **padded, **shape))
               for seed, (name, (q_lens, kv_lens)) in enumerate(cases.items())]
    empty = make_ragged_batch([2], [2], seed=9, **padded, **shape)
    batches.append(("no_sequences", dataclasses.replace(empty, num_seqs=np.zeros(1, np.int32))))
    return batches


@pytest.fixture(scope="session")
def scenarios():
    """ragged_scenarios, as a fixture for the kernel test files."""
    return ragged_scenarios



TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}


def check_kernel_against_reference(kernel, page_size: int, head_dim: int, num_q_heads: int,
                                   num_kv_heads: int, dtype, *, sm_scale: float,
                                   sliding_window: Optional[int] = None,
                                   soft_cap: Optional[float] = None) -> None:
    """Every ragged scenario: kernel == reference within the dtype's tolerance, zeros on padding.

    `kernel` takes the six attention arrays and the attention options; it is jitted here once and
    must compile once for all scenarios (they share one padded shape).
    """
    import jax
    import jax.numpy as jnp

    from pallas_kernels.ragged_paged_attention.reference import ragged_paged_attention_reference

    options = dict(sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap)
    jitted_kernel = jax.jit(lambda *args: kernel(*args, **options))
    reference = jax.jit(lambda *args: ragged_paged_attention_reference(*args, **options))
    tolerance = TOLERANCE[jnp.dtype(dtype).name]
    for name, batch in ragged_scenarios(page_size, num_q_heads=num_q_heads,
                                        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype):
        args = [jnp.asarray(a) for a in batch.attention_args()]
        out = jitted_kernel(*args)
        assert out.dtype == jnp.dtype(dtype) and out.shape == batch.q.shape, name
        out = np.asarray(out.astype(jnp.float32))
        expected = np.asarray(reference(*args).astype(jnp.float32))
        np.testing.assert_allclose(out, expected, atol=tolerance, rtol=tolerance, err_msg=name)
        num_real_tokens = batch.cu_q_lens[batch.num_seqs[0]]
        assert np.all(out[num_real_tokens:] == 0), f"{name}: padding rows must be zeros"
    assert jitted_kernel._cache_size() == 1, "one compile must serve every scenario"


def check_kernel_config(check_kernel, kernel_fn, page_size: int, head_dim: int, num_q_heads: int,
                        num_kv_heads: int, dtype, options: dict, **fixed) -> None:
    """Split a test config's options into attention options and the kernel's block options, then check it.

    `fixed` (e.g. interpret=True) goes to kernel_fn with the block options.
    """
    import functools

    attention = {k: options[k] for k in ("sliding_window", "soft_cap") if k in options}
    blocks = {k: v for k, v in options.items() if k not in attention}
    kernel = functools.partial(kernel_fn, **fixed, **blocks)
    check_kernel(kernel, page_size, head_dim, num_q_heads, num_kv_heads, dtype, sm_scale=head_dim ** -0.5,
                 **attention)


@pytest.fixture(scope="session")
def check_kernel():
    """check_kernel_against_reference, as a fixture for the kernel test files."""
    return check_kernel_against_reference
