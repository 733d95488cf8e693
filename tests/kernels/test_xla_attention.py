"""The "xla" backend (the jnp CPU path) against the plain spec loop, and the KV write."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.xla_attention import ragged_paged_attention_xla, write_kv_pages
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec, write_kv_spec

# (q_lens, kv_lens) as functions of the page size: the edge lengths 1, page-1, page, page+1, many pages.
BATCHES = {
    "decode_edges": lambda p: ([1, 1, 1, 1, 1], [1, p - 1, p, p + 1, 5 * p + 3]),
    "prefill_fresh": lambda p: ([p + 1, 3, 1], [p + 1, 3, 1]),
    "prefill_chunk": lambda p: ([5, p], [3 * p + 2, 2 * p]),
    "mixed": lambda p: ([1, 7, 1, 2 * p + 3], [4 * p + 1, 7, p, 3 * p]),
}


def _run_xla(batch, **options):
    args = batch.attention_args()
    return np.asarray(ragged_paged_attention_xla(*args, **options).astype(jnp.float32))


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(2, 2), (6, 2), (4, 1)])
def test_xla_matches_spec_loop(num_q_heads, num_kv_heads, scenarios):
    """Every real row equals the spec loop; padding rows and padded sequences come out as zeros."""
    attend = jax.jit(functools.partial(ragged_paged_attention_xla, sm_scale=0.125))
    for name, batch in scenarios(16, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                                 head_dim=64):
        expected = ragged_paged_attention_spec(*batch.attention_args(), sm_scale=0.125)
        out = np.asarray(attend(*batch.attention_args()))
        np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5, err_msg=name)
        assert np.all(out[batch.cu_q_lens[batch.num_seqs[0]]:] == 0), name
    assert attend._cache_size() == 1  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.parametrize("page_size,head_dim", [(32, 128), (16, 32)])
@pytest.mark.parametrize("pages_per_chunk,q_block_size", [(1, 4), (3, 32)])
def test_xla_page_and_chunk_sizes(page_size, head_dim, pages_per_chunk, q_block_size):
    """Page size, head dim and the loops' block sizes change nothing but speed."""
    q_lens, kv_lens = BATCHES["mixed"](page_size)
    batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=3, num_kv_heads=1, head_dim=head_dim,
                              page_size=page_size, pages_per_seq=6, num_pages=30)
    expected = ragged_paged_attention_spec(*batch.attention_args(), sm_scale=head_dim ** -0.5)
    out = _run_xla(batch, sm_scale=head_dim ** -0.5, pages_per_chunk=pages_per_chunk,
                         q_block_size=q_block_size)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("sliding_window,soft_cap", [(5, None), (17, None), (None, 3.0), (20, 2.0)])
def test_xla_sliding_window_and_soft_cap(sliding_window, soft_cap):
    """Sliding window keeps only the last `sliding_window` positions; soft cap squashes logits."""
    q_lens, kv_lens = BATCHES["mixed"](16)
    batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=4, num_kv_heads=2, head_dim=32,
                              page_size=16, num_tokens=sum(q_lens) + 3)
    options = dict(sm_scale=0.3, sliding_window=sliding_window, soft_cap=soft_cap)
    expected = ragged_paged_attention_spec(*batch.attention_args(), **options)
    out = _run_xla(batch, pages_per_chunk=1, q_block_size=8, **options)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


def test_xla_bfloat16():
    """bfloat16 inputs give bfloat16 output within bfloat16 rounding of the float64 loop."""
    q_lens, kv_lens = BATCHES["mixed"](16)
    batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=6, num_kv_heads=2, head_dim=64,
                              page_size=16, dtype=jnp.bfloat16)
    args = batch.attention_args()
    out = ragged_paged_attention_xla(*args, sm_scale=0.125)
    assert out.dtype == jnp.bfloat16
    expected = ragged_paged_attention_spec(*batch.attention_args(), sm_scale=0.125)
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=2e-2, rtol=2e-2)


def test_padding_has_no_effect_on_real_rows():
    """The same real batch padded to a bigger bucket gives the same real rows, and zero padding rows."""
    q_lens, kv_lens = BATCHES["mixed"](16)
    tight = make_ragged_batch(q_lens, kv_lens, num_q_heads=4, num_kv_heads=2, head_dim=32,
                              page_size=16, seed=3)
    num_real_seqs, num_real_tokens = len(q_lens), sum(q_lens)
    rng = np.random.default_rng(4)
    padded = dataclasses.replace(
        tight,
        q=np.concatenate([tight.q, rng.standard_normal((50, 4, 32), np.float32)]),
        kv_lens=np.pad(tight.kv_lens, (0, 5)),
        block_tables=np.pad(tight.block_tables, ((0, 5), (0, 7))),
        cu_q_lens=np.pad(tight.cu_q_lens, (0, 5), constant_values=num_real_tokens))
    out_tight = _run_xla(tight, sm_scale=0.2)
    out_padded = _run_xla(padded, sm_scale=0.2)
    assert padded.kv_lens.shape == (num_real_seqs + 5,)
    np.testing.assert_allclose(out_padded[:num_real_tokens], out_tight, atol=1e-6, rtol=1e-6)
    assert np.all(out_padded[num_real_tokens:] == 0)


def test_no_real_sequences_gives_zeros():
    """num_seqs = 0 (an all-padding step) is finite: all zeros."""
    batch = make_ragged_batch([2], [5], num_q_heads=2, num_kv_heads=1, head_dim=32, page_size=16,
                              num_tokens=8, max_num_seqs=3)
    q, kv_pages, metadata = batch.attention_args()
    metadata = dataclasses.replace(metadata, num_seqs=jnp.zeros(1, jnp.int32))
    out = ragged_paged_attention_xla(q, kv_pages, metadata, sm_scale=0.2)
    assert np.all(np.asarray(out) == 0)


def test_stacked_layers_with_offset_block_tables():
    """Layers stacked on the page axis with tables offset by layer * num_pages read their own layer."""
    q_lens, kv_lens = BATCHES["mixed"](16)
    layers = [make_ragged_batch(q_lens, kv_lens, num_q_heads=4, num_kv_heads=2, head_dim=32,
                                page_size=16, seed=seed) for seed in (1, 2)]
    num_pages = layers[0].kv_pages.shape[0]
    stacked_pages = jnp.concatenate([jnp.asarray(b.kv_pages) for b in layers])
    for layer, batch in enumerate(layers):
        q, _, metadata = batch.attention_args()
        metadata = metadata.on_pages_from(jnp.int32(layer * num_pages), page_size=16)
        out = ragged_paged_attention_xla(q, stacked_pages, metadata, sm_scale=0.2)
        expected = ragged_paged_attention_spec(*batch.attention_args(), sm_scale=0.2)  # numpy: nothing to compile
        np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5, err_msg=f"layer {layer}")


def test_traced_metadata_compiles_once():
    """kv_lens, tables, cu_q_lens and num_seqs are traced: new values of one shape reuse the program."""
    attend = jax.jit(functools.partial(ragged_paged_attention_xla, sm_scale=0.2))
    options: dict[str, Any] = dict(num_q_heads=2, num_kv_heads=1, head_dim=32, page_size=16, num_tokens=16,
                                   max_num_seqs=4, pages_per_seq=4, num_pages=12)
    for q_lens, kv_lens in [([1, 1], [3, 40]), ([5, 1, 2], [20, 17, 33]), ([9], [60])]:
        batch = make_ragged_batch(q_lens, kv_lens, **options)
        attend(*batch.attention_args())
    assert attend._cache_size() == 1  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_write_kv_pages_matches_loop(dtype):
    """Each token's K lands at head 2h and V at 2h+1 of its slot, bit-exactly; nothing else changes."""
    rng = np.random.default_rng(0)
    num_pages, page_size, num_kv_heads, head_dim, num_tokens = 6, 16, 3, 8, 10
    kv_pages = rng.standard_normal((num_pages, page_size, 2 * num_kv_heads, head_dim)).astype(dtype)
    k = rng.standard_normal((num_tokens, num_kv_heads, head_dim)).astype(dtype)
    v = rng.standard_normal((num_tokens, num_kv_heads, head_dim)).astype(dtype)
    slots = rng.choice(np.arange(page_size, num_pages * page_size), num_tokens, replace=False)
    slots = slots.astype(np.int32)
    expected = write_kv_spec(kv_pages, k, v, slots)
    out = write_kv_pages(jnp.asarray(kv_pages), jnp.asarray(k), jnp.asarray(v), jnp.asarray(slots))
    assert out.dtype == kv_pages.dtype
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_write_then_attend_equals_spec_loop():
    """Writing a step's K/V through slot_mapping then attending matches the loop over the written cache."""
    q_lens, kv_lens = BATCHES["mixed"](16)
    batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=4, num_kv_heads=2, head_dim=32,
                              page_size=16, num_tokens=sum(q_lens) + 4, max_num_seqs=6)
    rng = np.random.default_rng(5)
    k, v = rng.standard_normal((2, batch.q.shape[0], 2, 32)).astype(np.float32)
    kv_pages = write_kv_pages(jnp.asarray(batch.kv_pages), jnp.asarray(k), jnp.asarray(v),
                              jnp.asarray(batch.slot_mapping))
    q, _, metadata = batch.attention_args()
    real_rows = sum(q_lens)
    np.testing.assert_array_equal(np.asarray(kv_pages)[batch.slot_mapping[:real_rows] // 16,
                                                       batch.slot_mapping[:real_rows] % 16, 0::2],
                                  k[:real_rows])
    out = ragged_paged_attention_xla(q, kv_pages, metadata, sm_scale=0.2)
    np.testing.assert_allclose(np.asarray(out), ragged_paged_attention_spec(q, kv_pages, metadata, sm_scale=0.2),
                               atol=2e-5, rtol=2e-5)
