"""Attention sinks (gpt-oss: one learned logit per q head in the softmax's denominator only) through every backend:
a hand-worked case with the limits that bound a sink, the spec on a ragged step (decode, prefill, padding; GQA,
sliding window, soft cap), the error a wrong shape gets, and the per-shard split under tensor parallelism."""

import functools
import math
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec
from tests.kernels.conftest import jit_one_shot

PAGE = 16
# (backend, native_decode): the native CPU kernel, the jnp passes, and the two Pallas kernels interpreted.
BACKENDS = [("xla", True), ("xla", False), ("pallas_tpu", False), ("pallas_gpu", False)]
BACKEND_IDS = ["xla-native", "xla-jnp", "pallas_tpu", "pallas_gpu"]


def _attend(backend: str, native: bool, q, kv_pages, metadata, **options) -> np.ndarray:
    attend = jit_one_shot(functools.partial(ragged_paged_attention, backend=backend, native_decode=native, **options))
    return np.asarray(attend(q, kv_pages, metadata), np.float64)


def _hand_worked_step():
    """One sequence of two tokens, three q heads on one kv head: logits 0 and ln 3 (sm_scale 1), V rows 6 e0 and
    6 e1."""
    head_dim = 128  # the TPU interleaved layout's lane width
    kv_pages = np.zeros((2, PAGE, 2, head_dim), np.float32)
    kv_pages[1, 1, 0, 0] = math.log(3.0)  # K of token 1 (token 0's K is zero)
    kv_pages[1, 0, 1, 0] = 6.0            # V of token 0
    kv_pages[1, 1, 1, 1] = 6.0            # V of token 1
    q = np.zeros((8, 3, head_dim), np.float32)
    q[:, :, 0] = 1.0
    metadata = AttentionMetadata(slot_mapping=np.zeros(8, np.int32), kv_lens=np.array([2], np.int32),
                                 block_tables=np.array([[1]], np.int32), cu_q_lens=np.array([0, 1], np.int32),
                                 num_seqs=np.array([1], np.int32))
    return jnp.asarray(q), jnp.asarray(kv_pages), metadata


@pytest.mark.parametrize("backend,native", BACKENDS, ids=BACKEND_IDS)
def test_a_sink_joins_the_denominator_only(backend, native):
    """Logits 0 and ln 3 over V rows 6 e0 and 6 e1, per q head's sink: ln 2 gives (1 * 6 e0 + 3 * 6 e1) / (2 + 1 + 3)
    = (1, 3); a sink far below the logits gives the sink-less (1.5, 4.5); one far above them scales that output by
    4 / exp(30). Rows past the step stay zero."""
    q, kv_pages, metadata = _hand_worked_step()
    sinks = jnp.array([math.log(2.0), -1e4, 30.0], jnp.float32)
    out = _attend(backend, native, q, kv_pages, metadata, sm_scale=1.0, sinks=sinks)
    np.testing.assert_allclose(out[0, 0, :2], [1.0, 3.0], rtol=1e-5)
    np.testing.assert_allclose(out[0, 1, :2], [1.5, 4.5], rtol=1e-5)
    np.testing.assert_allclose(out[0, 2, :2], np.array([6.0, 18.0]) * math.exp(-30.0), rtol=1e-4)
    assert np.all(out[0, :, 2:] == 0) and np.all(out[1:] == 0)
    expected = ragged_paged_attention_spec(q, kv_pages, metadata, sm_scale=1.0, sinks=sinks)
    np.testing.assert_allclose(expected[0, 0, :2], [1.0, 3.0], rtol=1e-7)  # ln 2, ln 3 rounded to float32


@pytest.fixture(scope="module")
def ragged_step():
    """Decodes at page edges and deep in a sequence, a prefill chunk after earlier chunks, a fresh prefill, and
    padding rows and sequences; 8 q heads over 2 kv heads."""
    batch = make_ragged_batch([1, 1, 19, 1, 5], [1, PAGE + 1, 3 * PAGE + 2, 9 * PAGE + 5, 5], num_q_heads=8,
                              num_kv_heads=2, head_dim=64, page_size=PAGE, num_tokens=32, max_num_seqs=6, seed=3)
    sinks = np.random.default_rng(4).normal(size=8).astype(np.float32) * 2.0
    return batch, sinks


@pytest.mark.parametrize("backend,native", BACKENDS, ids=BACKEND_IDS)
def test_sinks_equal_the_spec_on_a_ragged_step(ragged_step, backend, native):
    """Every backend with sinks (beside a sliding window and a soft cap) equals the float64 spec on decode, prefill
    and padding rows (zeros), per q head."""
    batch, sinks = ragged_step
    options = dict(sliding_window=PAGE + 3, soft_cap=8.0)
    args = batch.attention_args()
    expected = ragged_paged_attention_spec(*args, sm_scale=0.125, sinks=sinks, **options)
    out = _attend(backend, native, *args, sm_scale=0.125, sinks=jnp.asarray(sinks), **options)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)
    assert np.all(out[batch.cu_q_lens[batch.num_seqs[0]]:] == 0)
    without = ragged_paged_attention_spec(*args, sm_scale=0.125, **options)
    assert np.abs(expected - without).max() > 0.1  # the sinks matter at these values


def test_sinks_of_the_wrong_shape_name_the_field(ragged_step):
    """sinks must be one logit per q head: anything else is a ValueError naming sinks and what it got."""
    import jaxtyping

    batch, sinks = ragged_step
    jaxtyping.config.update("jaxtyping_disable", True)  # the run-time annotation checks would answer first
    try:
        with pytest.raises(ValueError, match=r"sinks: must be \[num_q_heads\] = \[8\].*\(4,\)"):
            ragged_paged_attention(*batch.attention_args(), backend="xla", sm_scale=0.1, sinks=jnp.asarray(sinks[:4]))
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)


def test_each_tensor_parallel_shard_takes_its_own_heads_sinks():
    """Under shard_attention at tp 2 (two forced CPU devices) each shard attends with its own q heads' sinks: the
    result equals the spec with the whole layer's sinks."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
    result = subprocess.run([sys.executable, "-m", "tests.kernels.sinks_shard_worker"], env=env, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok"
