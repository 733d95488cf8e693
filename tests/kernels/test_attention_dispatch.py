"""The backend switch: name resolution, input validation, and that "xla" runs xla_attention.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention, resolve_attention_backend, write_kv
from jaxpaged.kernels.xla_attention import ragged_paged_attention_xla
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec


@pytest.fixture
def without_jaxtyping_checks():
    """The test suite checks array annotations at run time; these tests feed malformed arrays on purpose to see
    the ValueError users get (production runs without the annotation checks)."""
    import jaxtyping

    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", False)


@pytest.fixture(scope="module")
def batch():
    return make_ragged_batch([1, 4], [9, 20], num_q_heads=4, num_kv_heads=2, head_dim=32,
                             page_size=16, num_tokens=8, max_num_seqs=3)


def test_auto_resolves_by_platform():
    """On this CPU-only machine "auto" is the pure-jnp "xla" backend; explicit names pass through."""
    expected = {"cpu": "xla", "tpu": "pallas_tpu", "gpu": "pallas_gpu"}[jax.default_backend()]
    assert resolve_attention_backend("auto") == expected
    for name in ("xla", "pallas_tpu", "pallas_gpu"):
        assert resolve_attention_backend(name) == name


def test_unknown_backend_names_the_field():
    """An unknown name raises a ValueError naming attention_backend and what it got."""
    with pytest.raises(ValueError, match=r"attention_backend.*'flash'"):
        resolve_attention_backend("flash")


def test_xla_backend_is_xla_py(batch):
    """backend="xla" gives exactly ragged_paged_attention_xla's output."""
    args = batch.attention_args()
    out = ragged_paged_attention(*args, backend="xla", sm_scale=0.2, soft_cap=5.0)
    expected = ragged_paged_attention_xla(*args, sm_scale=0.2, soft_cap=5.0)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))


def _with(batch, **changes):
    """(q, kv_pages, metadata) with some arrays replaced, wherever they live."""
    arrays = dict(q=batch.q, kv_pages=batch.kv_pages, **vars(batch.metadata)) | changes
    q, kv_pages = jnp.asarray(arrays.pop("q")), jnp.asarray(arrays.pop("kv_pages"))
    return q, kv_pages, AttentionMetadata(**{name: jnp.asarray(a) for name, a in arrays.items()})


@pytest.mark.parametrize("changes,message", [
    (lambda b: dict(q=b.q[0]), r"q: must have rank 3, got shape \(4, 32\)"),
    (lambda b: dict(kv_pages=b.kv_pages[..., :16]), r"kv_pages: head_dim 16 differs.*32"),
    (lambda b: dict(kv_pages=b.kv_pages[:, :, :3]), r"kv_pages: axis 2 .* got 3"),
    (lambda b: dict(q=np.zeros((8, 3, 32), np.float32)), r"q: num_q_heads 3 .* num_kv_heads 2"),
    (lambda b: dict(q=b.q.astype(np.int32)), r"q: must be floating point, got int32"),
    (lambda b: dict(kv_pages=b.kv_pages.astype(jnp.bfloat16)), r"kv_pages: dtype .*float32.*bfloat16"),
    (lambda b: dict(kv_lens=b.kv_lens.astype(np.float32)), r"kv_lens: must be an integer array"),
    (lambda b: dict(block_tables=b.block_tables[:2]), r"block_tables: must have 3 rows"),
    (lambda b: dict(cu_q_lens=b.cu_q_lens[:3]), r"cu_q_lens: must have max_num_seqs \+ 1 = 4"),
    (lambda b: dict(num_seqs=np.array([1, 2], np.int32)), r"num_seqs: must have shape \(1,\)"),
    (lambda b: dict(slot_mapping=b.slot_mapping[:3]), r"slot_mapping: must have one slot per q row \(8\)"),
])
def test_bad_inputs_raise_with_what_they_got(without_jaxtyping_checks, batch, changes, message):
    """Each malformed input raises a ValueError naming the input and the offending value."""
    with pytest.raises(ValueError, match=message):
        ragged_paged_attention(*_with(batch, **changes(batch)), backend="xla", sm_scale=0.2)


@pytest.mark.parametrize("option,message", [
    (dict(sm_scale=0.0), "sm_scale"), (dict(sliding_window=0), "sliding_window"),
    (dict(soft_cap=-1.0), "soft_cap")])
def test_bad_options_raise(batch, option, message):
    """Non-positive sm_scale, sliding_window or soft_cap are rejected by name."""
    options = dict(sm_scale=0.2) | option
    with pytest.raises(ValueError, match=message):
        ragged_paged_attention(*_with(batch), backend="xla", **options)


def test_validation_happens_at_trace_time(without_jaxtyping_checks, batch):
    """Under jit the checks fire while tracing, on shapes alone."""
    attend = jax.jit(lambda q, kv_pages, metadata: ragged_paged_attention(q, kv_pages, metadata, backend="xla",
                                                                          sm_scale=1.0))
    with pytest.raises(ValueError, match="head_dim"):
        attend(*_with(batch, kv_pages=batch.kv_pages[..., :16]))


def test_write_kv_rejects_mismatched_pages(without_jaxtyping_checks, batch):
    """write_kv checks that k/v fit the page layout."""
    k = jnp.zeros((8, 2, 16), jnp.float32)
    with pytest.raises(ValueError, match=r"kv_pages: must be \[num_pages, page_size, 4, 16\]"):
        write_kv(jnp.asarray(batch.kv_pages), k, k, batch.metadata, backend="xla")


@pytest.mark.parametrize("backend", ["pallas_gpu", "pallas_tpu"])
def test_pallas_backends_run_interpreted_off_their_hardware(batch, backend):
    """On a CPU a Pallas backend runs its kernel in interpret mode and matches the spec."""
    args = batch.attention_args()
    out = ragged_paged_attention(*args, backend=backend, sm_scale=0.2)
    expected = ragged_paged_attention_spec(*args, sm_scale=0.2)  # numpy: no xla program to compile for it
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5)
