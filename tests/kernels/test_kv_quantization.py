"""Quantized KV rows (kv_cache_dtype "int8" / "fp8_e4m3"): codes plus a per-row bfloat16 scale rounded up. Round
trips stay within the scheme's bound (a hand-worked row, then random ones); the KV write stores exactly
quantize_rows of each token; attention over a quantized pool equals attention over the float32 pool of its
dequantized values; only the backends that read the layout accept it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention, write_kv
from jaxpaged.kernels.xla_attention import ragged_paged_attention_xla
from pallas_kernels.kv_quantization import (
    FP8_MAX,
    INT8_MAX,
    SCALE_BYTES,
    canonical_kv_cache_dtype,
    dequantize_rows,
    quantize_rows,
    quantized_pool_dtype,
    row_scales,
)
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape
from pallas_kernels.ragged_paged_attention.metadata import empty_attention_metadata
from tests.kernels.conftest import jit_one_shot

PAGE = 16
Q_LENS = [1, 1, 1, 1, 1, 5, PAGE + 1]
KV_LENS = [1, PAGE - 1, PAGE, PAGE + 1, 9 * PAGE + 5, 3 * PAGE + 2, PAGE + 1]
FORMATS = ["int8", "fp8_e4m3"]
# Jitted once here: eagerly each of their ~20 ops compiled a program per shape (the engine runs them under jit too).
quantize = jax.jit(quantize_rows, static_argnums=1)
dequantize = jax.jit(dequantize_rows)
scales_of = jax.jit(row_scales)
write_in_xla = jax.jit(functools.partial(write_kv, backend="xla"))


def test_a_hand_worked_int8_row():
    """absmax 2.54: 2.54 / 127 = 0.02 rounds up to the bfloat16 164 / 2^13 = 0.02001953125; codes round half even."""
    stored = quantize(jnp.array([[2.54, -1.27, 0.01, 0.0]], jnp.float32), jnp.int8)
    assert stored.shape == (1, 4 + SCALE_BYTES) and stored.dtype == jnp.int8
    assert float(scales_of(stored)[0]) == 164 / 2**13
    np.testing.assert_array_equal(np.asarray(stored[0, :4]), [127, -63, 0, 0])
    np.testing.assert_allclose(np.asarray(dequantize(stored)[0]),
                               [127 * 164 / 2**13, -63 * 164 / 2**13, 0.0, 0.0], rtol=0, atol=0)


def test_a_hand_worked_fp8_row():
    """absmax 448 gives scale 1; 1.0625 is half-way between e4m3's 1 and 1.125 and rounds to the even 1; 2^-9 is its
    smallest subnormal."""
    stored = quantize(jnp.array([[448.0, -1.0625, 2.0**-9, 0.0]]), jnp.uint8)
    assert float(scales_of(stored)[0]) == 1.0
    np.testing.assert_array_equal(np.asarray(dequantize(stored)[0]), [448.0, -1.0, 2.0**-9, 0.0])


@pytest.mark.parametrize("kv_format", FORMATS)
def test_random_rows_round_trip_within_the_bound(kv_format):
    rng = np.random.default_rng(0)
    # Rows of very different magnitudes: the scale is per row, so each is bounded by its own absmax.
    values = rng.standard_normal((64, 40)).astype(np.float32) * (10.0 ** rng.uniform(-4, 4, (64, 1)))
    stored = quantize(jnp.asarray(values), quantized_pool_dtype(kv_format))
    scale, back = np.asarray(scales_of(stored)), np.asarray(dequantize(stored))
    qmax = INT8_MAX if kv_format == "int8" else FP8_MAX
    absmax = np.abs(values).max(axis=1)
    assert np.all(scale >= absmax / qmax) and np.all(scale <= absmax / qmax * (1 + 2**-7))
    error = np.abs(back - values)
    if kv_format == "int8":
        bound = scale[:, None] / 2
    else:  # 3 mantissa bits: half an ulp is 2^-4 of the value; below the normal range, half of 2^-9 of the scale
        bound = np.maximum(np.abs(values) * 2**-4, scale[:, None] * 2**-10)
    assert np.all(error <= bound * (1 + 1e-6))


@pytest.mark.parametrize("kv_format", FORMATS)
def test_a_zero_row_reads_back_as_zeros(kv_format):
    stored = quantize(jnp.zeros((2, 8)), quantized_pool_dtype(kv_format))
    np.testing.assert_array_equal(np.asarray(dequantize(stored)), np.zeros((2, 8)))


def test_kv_cache_dtype_names():
    assert canonical_kv_cache_dtype("fp8") == "fp8_e4m3" and canonical_kv_cache_dtype("int8") == "int8"
    with pytest.raises(ValueError, match="^kv_cache_dtype: must be one of"):
        canonical_kv_cache_dtype("fp8_e5m2")
    assert cache_shape(7, PAGE, 3, 64, jnp.int8, "quantized") == ((7, PAGE, 6, 64 + SCALE_BYTES), jnp.int8)
    with pytest.raises(ValueError, match="dtype: the quantized layout is an int8 or uint8 pool, got float32"):
        cache_shape(7, PAGE, 3, 64, jnp.float32, "quantized")


@pytest.mark.parametrize("kv_format", FORMATS)
@pytest.mark.parametrize("num_tokens", [1, PAGE - 1, PAGE, PAGE + 1, 5 * PAGE])
def test_the_write_stores_each_tokens_quantized_rows(kv_format, num_tokens):
    rng = np.random.default_rng(num_tokens)
    pool_dtype = quantized_pool_dtype(kv_format)
    pool = jnp.asarray(rng.integers(-100, 100, (12, PAGE, 6, 16 + SCALE_BYTES)), pool_dtype)
    k, v = jnp.asarray(rng.standard_normal((2, num_tokens, 3, 16)), jnp.float32)
    slots = rng.choice(np.arange(PAGE, 12 * PAGE), num_tokens, replace=False)
    metadata = dataclasses.replace(empty_attention_metadata(num_tokens, 1, 1), slot_mapping=jnp.asarray(slots))
    written = np.asarray(write_in_xla(pool, k, v, metadata)).reshape(12 * PAGE, 6, -1)
    expected = np.asarray(pool).reshape(12 * PAGE, 6, -1).copy()
    expected[slots, 0::2] = np.asarray(quantize(k, pool_dtype))
    expected[slots, 1::2] = np.asarray(quantize(v, pool_dtype))
    np.testing.assert_array_equal(written, expected)


@pytest.mark.parametrize("kv_format,num_q_heads,num_kv_heads,sliding_window",
                         [("int8", 9, 3, PAGE + 1), ("fp8_e4m3", 6, 2, None)])
def test_attending_over_quantized_rows_equals_their_dequantized_float_pool(kv_format, num_q_heads, num_kv_heads,
                                                                           sliding_window):
    batch = make_ragged_batch(Q_LENS, KV_LENS, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=64,
                              page_size=PAGE, num_tokens=48, max_num_seqs=9, dtype=jnp.float32)
    q, pool, metadata = batch.attention_args()
    quantized = quantize(pool, quantized_pool_dtype(kv_format))
    attend = jit_one_shot(functools.partial(ragged_paged_attention_xla, sm_scale=0.125, sliding_window=sliding_window,
                                            native=False))
    out = attend(q, quantized, metadata)
    expected = attend(q, dequantize(quantized), metadata)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    # ... and the quantization is visible: the float pool itself gives another answer.
    unquantized = attend(q, pool, metadata)
    assert np.max(np.abs(np.asarray(unquantized) - np.asarray(out))) > 1e-4


@pytest.mark.parametrize("backend", ["pallas_tpu"])
def test_backends_without_the_quantized_layout_refuse_it(backend):
    batch = make_ragged_batch([1], [3], num_q_heads=2, num_kv_heads=1, head_dim=64, page_size=PAGE)
    q, pool, metadata = batch.attention_args()
    quantized = quantize(pool, jnp.int8)
    with pytest.raises(ValueError, match=f"kv_pages: the quantized layout \\(int8\\) is read by .* not {backend}"):
        ragged_paged_attention(q, quantized, metadata, backend=backend, sm_scale=0.125)
    k = jnp.zeros((1, 1, 64), jnp.float32)
    with pytest.raises(ValueError, match="kv_pages: the quantized layout"):
        write_kv(quantized, k, k, empty_attention_metadata(1, 1, 1), backend=backend)


PREFILL_Q_LENS = [2, PAGE - 1, PAGE + 1, 5, PAGE + 3, 1]
PREFILL_KV_LENS = [2, PAGE, 2 * PAGE + 1, 4 * PAGE - 1, 9 * PAGE + 5, 3 * PAGE]


@pytest.mark.parametrize("kv_format,num_q_heads,num_kv_heads,head_dim,sliding_window,soft_cap", [
    # head_dim 40: a size read at run time (64 and 128 are fixed at compile time)
    ("int8", 6, 2, 64, None, None), ("int8", 4, 4, 40, 5, None), ("fp8_e4m3", 9, 3, 64, PAGE + 1, 2.0),
    ("fp8_e4m3", 4, 4, 40, 5, None),
    pytest.param("int8", 9, 3, 64, PAGE + 1, 2.0, marks=pytest.mark.slow),
    pytest.param("int8", 8, 1, 128, None, 30.0, marks=pytest.mark.slow),
    pytest.param("fp8_e4m3", 6, 2, 64, None, None, marks=pytest.mark.slow),
    pytest.param("fp8_e4m3", 8, 1, 128, None, 30.0, marks=pytest.mark.slow)])
def test_the_native_kernel_dequantizes_as_the_jnp_path_does(kv_format, num_q_heads, num_kv_heads, head_dim,
                                                            sliding_window, soft_cap):
    """The native CPU kernel streams quantized pages (codes widened and scaled row by row) to the jnp path's result,
    on decodes at the edge lengths and on prefill chunks (both steps share one padded shape: one compile each)."""
    from jaxpaged.kernels.cpu_native.paged_decode import native_decode_available

    assert native_decode_available()
    options = dict(sm_scale=head_dim ** -0.5, sliding_window=sliding_window, soft_cap=soft_cap)
    native_rows, jnp_rows = (jit_one_shot(functools.partial(ragged_paged_attention_xla, native=native, **options))
                             for native in (True, False))
    for name, q_lens, kv_lens in [("decodes", Q_LENS, KV_LENS), ("prefills", PREFILL_Q_LENS, PREFILL_KV_LENS)]:
        batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                                  head_dim=head_dim, page_size=PAGE, num_tokens=64, max_num_seqs=9, pages_per_seq=10,
                                  num_pages=24, dtype=jnp.float32)
        q, pool, metadata = batch.attention_args()
        quantized = quantize(pool, quantized_pool_dtype(kv_format))
        native = np.asarray(native_rows(q, quantized, metadata))
        in_jnp = np.asarray(jnp_rows(q, quantized, metadata))
        np.testing.assert_allclose(native, in_jnp, atol=2e-5, rtol=2e-5, err_msg=name)
        assert np.all(native[sum(q_lens):] == 0), f"{name}: padding rows"


@pytest.mark.parametrize("kv_format", FORMATS)
def test_a_quantized_pool_goes_through_the_native_kernel(kv_format):
    batch = make_ragged_batch(Q_LENS, KV_LENS, num_q_heads=6, num_kv_heads=2, head_dim=64, page_size=PAGE)
    q, pool, metadata = batch.attention_args()
    quantized = quantize(pool, quantized_pool_dtype(kv_format))
    hlo = jax.jit(functools.partial(ragged_paged_attention_xla, sm_scale=0.125)).lower(q, quantized, metadata)
    assert "jaxpaged_paged_decode" in hlo.as_text()


@pytest.mark.parametrize("kv_format,num_q_heads,num_kv_heads,head_dim,sliding_window,soft_cap",
                         [("int8", 8, 2, 80, PAGE + 1, 30.0), ("fp8_e4m3", 6, 2, 64, None, None),
                          pytest.param("int8", 6, 2, 64, None, None, marks=pytest.mark.slow),
                          pytest.param("fp8_e4m3", 8, 2, 80, PAGE + 1, 30.0, marks=pytest.mark.slow)])
def test_the_gpu_kernel_in_interpret_mode_dequantizes_as_the_jnp_path_does(kv_format, num_q_heads, num_kv_heads,
                                                                           head_dim, sliding_window, soft_cap):
    """pallas_gpu (Triton lowering, interpreted) over a quantized pool: decodes at the edge lengths and prefill chunks
    in one launch, head_dim 80 read padded to 128, equal to the xla backend's jnp path."""
    from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec

    batch = make_ragged_batch(Q_LENS, KV_LENS, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                              page_size=PAGE, num_tokens=48, max_num_seqs=9, dtype=jnp.float32)
    q, pool, metadata = batch.attention_args()
    quantized = quantize(pool, quantized_pool_dtype(kv_format))
    options = dict(sm_scale=head_dim ** -0.5, sliding_window=sliding_window, soft_cap=soft_cap)
    got = np.asarray(jit_one_shot(functools.partial(ragged_paged_attention, backend="pallas_gpu", **options))(
        q, quantized, metadata))
    expected = np.asarray(jit_one_shot(functools.partial(ragged_paged_attention_xla, native=False, **options))(
        q, quantized, metadata))
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=2e-5)
    # ... and the kernel read the codes: attention over the float pool (the numpy spec, no second kernel compile)
    # gives another answer.
    assert np.max(np.abs(ragged_paged_attention_spec(q, pool, metadata, **options) - got)) > 1e-4


@pytest.mark.parametrize("kv_format,num_q_heads,num_kv_heads,head_dim,dtype",
                         [("int8", 9, 3, 64, jnp.float32), ("fp8_e4m3", 32, 8, 128, jnp.bfloat16),
                          ("int8", 32, 8, 128, jnp.bfloat16), ("fp8_e4m3", 9, 3, 64, jnp.float32)])
def test_the_gpu_kernel_over_a_quantized_pool_lowers_to_triton(kv_format, num_q_heads, num_kv_heads, head_dim, dtype):
    """Pallas' Triton lowering accepts the 8-bit loads, the scale bytes and the dequantization at real shapes."""
    from pallas_kernels.ragged_paged_attention.gpu import ragged_paged_attention_gpu
    from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata

    num_tokens, max_num_seqs, pages_per_seq = 64, 8, 16
    fields = [jax.ShapeDtypeStruct(shape, jnp.int32) for shape in (
        (num_tokens,), (max_num_seqs,), (max_num_seqs, pages_per_seq), (max_num_seqs + 1,), (1,))]
    args = (jax.ShapeDtypeStruct((num_tokens, num_q_heads, head_dim), dtype),
            jax.ShapeDtypeStruct((64, PAGE, 2 * num_kv_heads, head_dim + SCALE_BYTES), quantized_pool_dtype(kv_format)),
            *fields)
    kernel = functools.partial(ragged_paged_attention_gpu, sm_scale=0.1, sliding_window=64, soft_cap=30.0)
    attend = jax.jit(lambda q, kv_pages, *fields: kernel(q, kv_pages, AttentionMetadata(*fields)))
    assert attend.trace(*args).lower(lowering_platforms=("cuda",)).as_text().count("xla.gpu.triton") == 1
