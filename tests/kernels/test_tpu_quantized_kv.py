"""Both TPU kernels reading the packed quantized KV layout under the TPU interpreter, against the spec over the
fake-quantized (dequantized, float) cache: the kernels must add no error of their own beyond float rounding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.kv_quantization import dequantize_rows, quantize_rows, quantized_pool_dtype
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.kv_layout_quantized import pack_quantized_pages
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec
from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu
from pallas_kernels.ragged_paged_attention.tpu_quantized_kv import _byte_to_float
from tests.kernels.conftest import jit_one_shot

# (page_size, head_dim, num_q_heads, num_kv_heads, q dtype, kv_cache_dtype, kernel options): combined [K | V] vectors
# and lane tiles, int8 and fp8, float32 and bfloat16 q, a sliding window with a soft cap.
CONFIGS = [
    (16, 64, 4, 2, jnp.float32, "int8", dict(q_block_size=16, pages_per_chunk=2)),
    (32, 128, 6, 2, jnp.bfloat16, "fp8_e4m3", dict(q_block_size=16)),
    (8, 128, 3, 1, jnp.float32, "fp8_e4m3", dict(q_block_size=16, sliding_window=20, soft_cap=5.0)),
]
TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}
# Jitted once here (the engine runs them under jit): eagerly each of their ops compiled a program per shape.
quantize = jax.jit(quantize_rows, static_argnums=1)
dequantize = jax.jit(dequantize_rows)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"p{c[0]}-d{c[1]}-h{c[2]}x{c[3]}-{jnp.dtype(c[4]).name}-"
                                                         f"{c[5]}")
def test_tpu_kernels_read_the_quantized_cache(config, scenarios):
    """Every ragged scenario (decode-only with lengths 1, page - 1, page, page + 1 and many pages; prefill-only;
    mixed; no sequences), each step case the dispatch picks, equals the spec on the dequantized cache."""
    page_size, head_dim, num_q_heads, num_kv_heads, dtype, kv_cache_dtype, options = config
    window_and_cap = {k: options.pop(k) for k in ("sliding_window", "soft_cap") if k in options}
    sm_scale = head_dim ** -0.5
    attend = jit_one_shot(functools.partial(ragged_paged_attention_tpu, sm_scale=sm_scale, num_kv_heads=num_kv_heads,
                                            kv_cache_dtype=kv_cache_dtype, page_size=page_size, interpret=True,
                                            **options, **window_and_cap))
    tolerance = TOLERANCE[jnp.dtype(dtype).name]
    for name, batch in scenarios(page_size, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                 dtype=dtype):
        q, kv_pages, metadata = batch.attention_args()
        stored = quantize(kv_pages, quantized_pool_dtype(kv_cache_dtype))
        out = attend(q, pack_quantized_pages(stored), metadata)
        assert out.dtype == jnp.dtype(dtype) and out.shape == q.shape, name
        expected = ragged_paged_attention_spec(q, dequantize(stored), metadata, sm_scale=sm_scale,
                                               **window_and_cap)
        np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), expected, atol=tolerance, rtol=tolerance,
                                   err_msg=name)
        num_real_tokens = batch.cu_q_lens[batch.num_seqs[0]]
        assert np.all(np.asarray(out)[num_real_tokens:] == 0), f"{name}: padding rows must be zeros"
    assert attend._cache_size() == 1, "one compile must serve every scenario"  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8_e4m3"])
def test_every_8_bit_code_decodes_in_kernel(kv_cache_dtype):
    """All 256 codes in each byte position, through the in-kernel shifts and bitcasts, equal jnp's int8 /
    float8_e4m3fn conversion (fp8's two NaN codes are never written: the scale keeps codes within +-448)."""
    codes = np.arange(256, dtype=np.uint32).reshape(2, 128)

    def kernel(words_ref, out_ref):
        for byte in range(4):
            out_ref[byte] = _byte_to_float(words_ref[...], byte, kv_cache_dtype)

    words = np.zeros_like(codes)
    for byte in range(4):
        words |= np.roll(codes, 37 * byte) << np.uint32(8 * byte)
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((4, 2, 128), jnp.float32),
                         interpret=pltpu.InterpretParams())(jnp.asarray(words))
    view = np.int8 if kv_cache_dtype == "int8" else jnp.float8_e4m3fn
    for byte in range(4):
        expected = np.roll(codes, 37 * byte).astype(np.uint8).view(view).astype(np.float32)
        real = ~np.isnan(expected)
        assert real.sum() == (256 if kv_cache_dtype == "int8" else 254)
        np.testing.assert_array_equal(np.asarray(out[byte])[real], expected[real])


def test_quantized_cache_needs_its_page_size():
    q = jnp.zeros((8, 2, 128), jnp.float32)
    metadata = make_ragged_batch([1], [3], num_tokens=8, max_num_seqs=2, pages_per_seq=2, num_pages=4, page_size=8,
                                 num_q_heads=2, num_kv_heads=1, head_dim=128, dtype=jnp.float32).metadata
    words = jnp.zeros((4, 16, 128), jnp.uint32)
    with pytest.raises(ValueError, match="page_size"):
        ragged_paged_attention_tpu(q, words, metadata, sm_scale=0.1, num_kv_heads=1, kv_cache_dtype="int8",
                                   interpret=True)
    with pytest.raises(ValueError, match="kv_pages"):  # 8 tokens of one head are 8 rows, not 16
        ragged_paged_attention_tpu(q, words, metadata, sm_scale=0.1, num_kv_heads=1, kv_cache_dtype="int8",
                                   page_size=8, interpret=True)


def test_each_tensor_parallel_shard_writes_then_reads_its_rows():
    """What mesh.shard_attention runs per shard, through dispatch: the step's K / V written into the shard's rows of a
    tp-2 pool (4 KV heads of 128, 2 per shard), then attention over the shard's q heads. Together: the pool unpacks to
    the quantized pool after the step's writes, and the output is the spec's over its dequantized values."""
    from jaxpaged.kernels.attention_dispatch import ragged_paged_attention, write_kv
    from pallas_kernels.ragged_paged_attention.kv_layout_quantized import unpack_quantized_pages

    page, tp, num_kv_heads, num_q_heads = 16, 2, 4, 8
    batch = make_ragged_batch([1, 17, 1, 5], [1, page + 1, page, 3 * page + 7], num_q_heads=num_q_heads,
                              num_kv_heads=num_kv_heads, head_dim=128, page_size=page, num_tokens=32, max_num_seqs=4,
                              seed=5)
    # Made and sliced on the host: an eager slice of a device array compiles a program per slice.
    k, v = np.random.default_rng(6).standard_normal((2, 32, num_kv_heads, 128)).astype(np.float32)
    q, kv_pages, metadata = batch.attention_args()
    host_q, stored = np.asarray(q), np.asarray(quantize(kv_pages, jnp.int8))
    # Both shards have one shape: each program compiles once.
    write = jit_one_shot(functools.partial(write_kv, backend="pallas_tpu", kv_cache_dtype="int8", page_size=page))
    attend = jit_one_shot(functools.partial(ragged_paged_attention, backend="pallas_tpu", sm_scale=0.125,
                                            num_kv_heads=2, kv_cache_dtype="int8", page_size=page))
    pools, outs = [], []
    for shard, rows in enumerate(np.split(np.asarray(pack_quantized_pages(jnp.asarray(stored), tp)), tp, axis=1)):
        kv_heads, q_heads = slice(2 * shard, 2 * shard + 2), slice(4 * shard, 4 * shard + 4)
        pools.append(write(jnp.asarray(rows), jnp.asarray(k[:, kv_heads]), jnp.asarray(v[:, kv_heads]), metadata))
        outs.append(attend(jnp.asarray(host_q[:, q_heads]), pools[-1], metadata))
    num_real = int(batch.cu_q_lens[4])
    slots = np.asarray(batch.slot_mapping)[:num_real]
    new_rows = quantize(jnp.asarray(np.stack([k, v], axis=2).reshape(32, 2 * num_kv_heads, 128)[:num_real]),
                        jnp.int8)
    expected = stored.copy()
    expected[slots // page, slots % page] = np.asarray(new_rows)
    written = unpack_quantized_pages(jnp.asarray(np.concatenate([np.asarray(pool) for pool in pools], axis=1)),
                                     num_kv_heads, 128, "int8", page, tp)
    np.testing.assert_array_equal(np.asarray(written)[1:], expected[1:])  # page 0: padding's garbage
    reference = ragged_paged_attention_spec(q, dequantize(jnp.asarray(expected)), metadata, sm_scale=0.125)
    out = np.concatenate([np.asarray(part) for part in outs], axis=1)
    np.testing.assert_allclose(out[:num_real], reference[:num_real], atol=2e-5, rtol=2e-5)
