"""The "interleaved_bits" layout: a bfloat16 KV pool held as its uint16 bits, because XLA:CPU converts a bfloat16
scatter's whole operand to float32 and back (not in place). Writing and attending through bits must give exactly
what the bfloat16 pool gives, on the native decode kernel and the jnp path alike."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention, write_kv
from jaxpaged.kernels.xla_attention import ragged_paged_attention_xla
from pallas_kernels.bfloat16_bits import BITS_DTYPE, from_bits, to_bits
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape, kv_storage
from pallas_kernels.ragged_paged_attention.metadata import empty_attention_metadata
from pallas_kernels.ragged_paged_attention.spec import write_kv_spec

PAGE = 16
# Decodes at kv lengths 1, page - 1, page, page + 1 and many pages, a prefill chunk and a fresh prompt.
Q_LENS = [1, 1, 1, 1, 1, 5, PAGE + 1]
KV_LENS = [1, PAGE - 1, PAGE, PAGE + 1, 9 * PAGE + 5, 3 * PAGE + 2, PAGE + 1]


def test_cache_shape_holds_bfloat16_only():
    assert cache_shape(7, PAGE, 3, 64, jnp.bfloat16, "interleaved_bits") == ((7, PAGE, 6, 64), BITS_DTYPE)
    with pytest.raises(ValueError, match="dtype: the interleaved_bits layout holds bfloat16, got float32"):
        cache_shape(7, PAGE, 3, 64, jnp.float32, "interleaved_bits")


def test_values_and_storage_round_trip_bit_for_bit():
    values = jnp.asarray(np.random.default_rng(0).standard_normal((5, 4)), jnp.bfloat16)
    stored = kv_storage(values, BITS_DTYPE)
    assert stored.dtype == BITS_DTYPE
    np.testing.assert_array_equal(np.asarray(from_bits(stored)), np.asarray(values))
    # Float pools store and read their own dtype; float32 values are rounded to bfloat16 for bits.
    assert kv_storage(values, jnp.float32).dtype == jnp.float32 and from_bits(values) is values
    np.testing.assert_array_equal(np.asarray(kv_storage(values.astype(jnp.float32), BITS_DTYPE)), np.asarray(stored))


@pytest.mark.parametrize("num_tokens", [1, PAGE - 1, PAGE, PAGE + 1, 5 * PAGE])
def test_writing_bits_equals_writing_bfloat16(num_tokens):
    rng = np.random.default_rng(num_tokens)
    pool = jnp.asarray(rng.standard_normal((12, PAGE, 6, 64)), jnp.bfloat16)
    k, v = jnp.asarray(rng.standard_normal((2, num_tokens, 3, 64)), jnp.bfloat16)
    slots = jnp.asarray(rng.choice(np.arange(PAGE, 12 * PAGE), num_tokens, replace=False), jnp.int32)
    metadata = dataclasses.replace(empty_attention_metadata(num_tokens, 1, 1), slot_mapping=slots)
    written_bits = write_kv(to_bits(pool), k, v, metadata, backend="xla")
    assert written_bits.dtype == BITS_DTYPE
    # The spec's write of the bfloat16 values (numpy: no second write program per length), as bits.
    expected = write_kv_spec(np.asarray(pool), np.asarray(k), np.asarray(v), np.asarray(slots))
    np.testing.assert_array_equal(np.asarray(written_bits), expected.view(np.uint16))


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("num_q_heads,num_kv_heads,sliding_window", [(6, 2, None), (9, 3, PAGE + 1)])
def test_attending_over_bits_equals_the_bfloat16_pool(native, num_q_heads, num_kv_heads, sliding_window):
    batch = make_ragged_batch(Q_LENS, KV_LENS, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=64,
                              page_size=PAGE, num_tokens=48, max_num_seqs=9, dtype=jnp.bfloat16)
    q, pool, metadata = batch.attention_args()
    options = dict(sm_scale=0.125, sliding_window=sliding_window, native=native)
    out = ragged_paged_attention_xla(q, to_bits(pool), metadata, **options)
    assert out.dtype == jnp.bfloat16
    expected = ragged_paged_attention_xla(q, pool, metadata, **options)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(expected, np.float32))


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_only_the_xla_backend_takes_bits(backend):
    batch = make_ragged_batch([1], [3], num_q_heads=2, num_kv_heads=1, head_dim=64, page_size=PAGE,
                              dtype=jnp.bfloat16)
    q, pool, metadata = batch.attention_args()
    with pytest.raises(ValueError, match=f"kv_pages: the interleaved_bits layout .* xla backend only, not {backend}"):
        ragged_paged_attention(q, to_bits(pool), metadata, backend=backend, sm_scale=0.125)
    k = jnp.zeros((1, 1, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="kv_pages: the interleaved_bits layout"):
        write_kv(to_bits(pool), k, k, empty_attention_metadata(1, 1, 1), backend=backend)
