"""The native CPU kernel (jaxpaged/kernels/cpu_native) inside the "xla" backend: it is really built and called, and it
equals the spec loop and the jnp passes at the edge lengths, with GQA, windows, soft caps and bf16, for decode rows
and for prefill rows (each a decode at its own position)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels import xla_attention
from jaxpaged.kernels.cpu_native.paged_decode import native_decode_available
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec
from tests.kernels.conftest import jit_one_shot

PAGE = 16
# Decode rows at kv lengths 1, page - 1, page, page + 1 and many pages, beside a prefill and a padded sequence.
Q_LENS = [1, 1, 1, 1, 1, 7, 1]
KV_LENS = [1, PAGE - 1, PAGE, PAGE + 1, 9 * PAGE + 5, 7, 3 * PAGE]
# Prefill chunks: fresh and after earlier chunks, ending at and across page edges, one longer than a page, and one
# over many pages, beside a decode.
PREFILL_Q_LENS = [2, PAGE - 1, PAGE + 1, 5, PAGE + 3, 1]
PREFILL_KV_LENS = [2, PAGE, 2 * PAGE + 1, 4 * PAGE - 1, 9 * PAGE + 5, 3 * PAGE]


def test_the_kernel_is_built_and_in_the_compiled_step():
    assert native_decode_available()  # gcc is part of every machine this project runs tests on
    batch = make_ragged_batch(Q_LENS, KV_LENS, num_q_heads=6, num_kv_heads=2, head_dim=64, page_size=PAGE)
    hlo = jax.jit(functools.partial(xla_attention.ragged_paged_attention_xla, sm_scale=0.125)).lower(
        *batch.attention_args()).as_text()
    assert "jaxpaged_paged_decode" in hlo


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim,sliding_window,soft_cap", [
    # head_dim 40: a size read at run time (64 and 128 are fixed at compile time)
    (6, 2, 64, None, None), (4, 4, 40, 5, None), (9, 3, 64, PAGE + 1, 2.0), (8, 1, 128, None, 30.0)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_native_rows_equal_the_spec_and_the_jnp_passes(num_q_heads, num_kv_heads, head_dim, sliding_window, soft_cap,
                                                        dtype):
    """Decode rows at the edge lengths, then prefill chunks: native == spec loop == jnp passes, padding rows zero. The
    two steps share one padded shape, so each path compiles once for both."""
    options = dict(sm_scale=head_dim ** -0.5, sliding_window=sliding_window, soft_cap=soft_cap)
    tolerance = 2e-5 if dtype == jnp.float32 else 2e-2
    native_rows, jnp_rows = (jit_one_shot(functools.partial(xla_attention.ragged_paged_attention_xla, native=native,
                                                            **options)) for native in (True, False))
    for name, q_lens, kv_lens in [("decodes", Q_LENS, KV_LENS), ("prefills", PREFILL_Q_LENS, PREFILL_KV_LENS)]:
        batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                                  head_dim=head_dim, page_size=PAGE, num_tokens=64, max_num_seqs=9, pages_per_seq=10,
                                  num_pages=24, dtype=dtype)
        args = batch.attention_args()
        expected = ragged_paged_attention_spec(*args, **options)
        native = np.asarray(native_rows(*args), np.float32)
        in_chunks = np.asarray(jnp_rows(*args), np.float32)
        np.testing.assert_allclose(native, expected, atol=tolerance, rtol=tolerance, err_msg=f"{name}: native vs spec")
        np.testing.assert_allclose(native, in_chunks, atol=tolerance, rtol=tolerance, err_msg=f"{name}: native vs jnp")
        assert np.all(native[sum(q_lens):] == 0), f"{name}: padding rows"
