"""The packed TPU KV layout: exact round trip, physical bytes, and the dispatch path that reads and writes it."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention, write_kv
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape, physical_bytes
from pallas_kernels.ragged_paged_attention.kv_layout_packed import pack_kv_pages, unpack_kv_pages
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec, write_kv_spec
from tests.kernels.conftest import jit_one_shot

# Jitted once here (the engine runs them under jit): eagerly each of their ops compiled a program per shape.
pack = jax.jit(pack_kv_pages, static_argnums=1)
unpack = jax.jit(unpack_kv_pages, static_argnums=(1, 2, 3, 4))


def random_pages(seed: int, shape: tuple, dtype) -> jax.Array:
    """Normal values made on the host (no program compiled for them), in `dtype`."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


@pytest.mark.parametrize("num_kv_heads,head_dim,dtype", [(3, 64, jnp.float32), (3, 64, jnp.bfloat16),
                                                         (8, 128, jnp.bfloat16), (2, 256, jnp.float32)])
def test_pack_round_trips_exactly(num_kv_heads, head_dim, dtype):
    """unpack(pack(cache)) == cache bit for bit, and pack gives cache_shape's shape and dtype."""
    kv_pages = random_pages(0, (3, 16, 2 * num_kv_heads, head_dim), dtype)
    words = pack(kv_pages, 1)
    assert (words.shape, words.dtype) == cache_shape(3, 16, num_kv_heads, head_dim, dtype, "packed")
    np.testing.assert_array_equal(np.asarray(unpack(words, num_kv_heads, head_dim, dtype, 1)), np.asarray(kv_pages))


def test_bfloat16_head_dim_128_shares_words_between_k_and_v():
    """Word row h of a token holds K_h in its low and V_h in its high 16 bits."""
    kv_pages = np.asarray(random_pages(1, (1, 16, 4, 128), jnp.bfloat16))
    words = np.asarray(pack(jnp.asarray(kv_pages), 1)).reshape(1, 16, 2, 128)
    half = lambda w: w.astype(np.uint16).view(jnp.bfloat16)  # noqa: E731
    np.testing.assert_array_equal(half(words[:, :, 1] & 0xFFFF), kv_pages[:, :, 2])
    np.testing.assert_array_equal(half(words[:, :, 1] >> 16), kv_pages[:, :, 3])


@pytest.mark.parametrize("num_kv_heads,head_dim,dtype,interleaved_ratio", [
    (3, 64, jnp.bfloat16, 16 * 128 / (6 * 64)),  # 6 heads x 64 lanes padded to a 16 x 128 tile
    (8, 128, jnp.bfloat16, 1.0), (3, 64, jnp.float32, 8 * 128 / (6 * 64))])
def test_physical_bytes_count_tpu_tile_padding(num_kv_heads, head_dim, dtype, interleaved_ratio):
    """TPU pads (sublanes, lanes) to tiles; the packed layout's physical bytes are its logical bytes."""
    logical = 1024 * 16 * 2 * num_kv_heads * head_dim * jnp.dtype(dtype).itemsize
    shape, kv_dtype = cache_shape(1024, 16, num_kv_heads, head_dim, dtype, "interleaved")
    assert physical_bytes(shape, kv_dtype, "cpu") == logical
    assert physical_bytes(shape, kv_dtype, "tpu") == logical * interleaved_ratio
    packed = physical_bytes(*cache_shape(1024, 16, num_kv_heads, head_dim, dtype, "packed"), "tpu")
    assert packed <= logical * (4 / 3)  # an odd bfloat16 head count leaves one half-word row per token


@pytest.mark.parametrize("num_kv_heads,head_dim,dtype,num_shards", [(4, 64, jnp.bfloat16, 2), (8, 128, jnp.bfloat16, 8),
                                                                    (6, 64, jnp.float32, 3), (4, 256, jnp.float32, 4)])
def test_sharded_pack_puts_each_shards_heads_in_its_own_rows(num_kv_heads, head_dim, dtype, num_shards):
    """Under tensor parallelism a page's rows are shard-major: shard i's slice of axis 1 is exactly the packed page of
    its heads (what its kernels read), the shape is cache_shape's, and the round trip is exact."""
    kv_pages = random_pages(3, (3, 16, 2 * num_kv_heads, head_dim), dtype)
    words = pack(kv_pages, num_shards)
    assert (words.shape, words.dtype) == cache_shape(3, 16, num_kv_heads, head_dim, dtype, "packed", num_shards)
    heads_per_shard = num_kv_heads // num_shards
    rows = words.shape[1] // num_shards
    host_pages, host_words = np.asarray(kv_pages), np.asarray(words)  # sliced on the host: no program per slice
    for shard in range(num_shards):
        own_heads = host_pages[:, :, 2 * heads_per_shard * shard:2 * heads_per_shard * (shard + 1)]
        np.testing.assert_array_equal(host_words[:, rows * shard:rows * (shard + 1)],
                                      np.asarray(pack(jnp.asarray(own_heads), 1)), err_msg=f"shard {shard}")
    np.testing.assert_array_equal(np.asarray(unpack(words, num_kv_heads, head_dim, dtype, num_shards)), host_pages)
    with pytest.raises(ValueError, match="num_shards: must be a positive divisor"):
        cache_shape(3, 16, num_kv_heads, head_dim, dtype, "packed", num_kv_heads + 1)


def test_tpu_pool_is_sized_per_shard_from_the_per_shard_heads():
    """Llama-3-8B at tp 8 on a TPU: one KV head per chip. A packed block costs each chip 1/8 of the logical bytes (what
    XLA:TPU allocates, docs/tpu-compile.md); the interleaved shard's [2, 128] bfloat16 tile is counted padded to 16
    sublanes, 8x that (an upper bound: XLA:TPU was measured storing it unpadded)."""
    from jaxpaged.models.model_config import ModelConfig
    from jaxpaged.runner.kv_cache import bytes_per_block, logical_bytes_per_block

    llama = ModelConfig(architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                        num_layers=32, num_q_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
                        rope_theta=5e5, max_position_embeddings=8192, tie_word_embeddings=False)
    logical = logical_bytes_per_block(llama, 16, jnp.bfloat16)
    for tp in (1, 2, 4, 8):
        assert bytes_per_block(llama, 16, jnp.bfloat16, "tpu", "packed", num_shards=tp) == logical // tp
    assert bytes_per_block(llama, 16, jnp.bfloat16, "tpu", "interleaved", num_shards=8) == logical
    assert bytes_per_block(llama, 16, jnp.bfloat16, "cpu", "interleaved", num_shards=8) == logical // 8


@pytest.mark.parametrize("head_dim,dtype", [(64, jnp.bfloat16)])
def test_dispatch_packed_write_then_attend_matches_xla(head_dim, dtype):
    """The model's two calls on a packed cache (pallas_tpu, interpreter) equal the spec's write then attention on the
    interleaved one (numpy: nothing more to compile)."""
    batch = make_ragged_batch([5, 1, 1], [40, 20, 33], num_q_heads=6, num_kv_heads=3 if head_dim == 64 else 2,
                              head_dim=head_dim, page_size=16, dtype=dtype, num_tokens=8, max_num_seqs=3, seed=2)
    q, kv_pages, metadata = batch.attention_args()
    num_kv_heads = kv_pages.shape[2] // 2
    rng = np.random.default_rng(0)
    k, v = (jnp.asarray(a.astype(dtype)) for a in rng.standard_normal((2, 8, num_kv_heads, head_dim)))
    metadata = dataclasses.replace(metadata, slot_mapping=jnp.asarray(batch.slot_mapping))
    expected_pages = write_kv_spec(kv_pages, k, v, batch.slot_mapping)
    expected = ragged_paged_attention_spec(q, expected_pages, metadata, sm_scale=0.1)
    write = jit_one_shot(functools.partial(write_kv, backend="pallas_tpu"))
    attend = jit_one_shot(functools.partial(ragged_paged_attention, backend="pallas_tpu", sm_scale=0.1,
                                            num_kv_heads=num_kv_heads))
    packed = write(pack(kv_pages, 1), k, v, metadata)
    out = attend(q, packed, metadata)
    tolerance = 2e-5 if dtype == jnp.float32 else 3e-2
    np.testing.assert_allclose(np.asarray(out).astype(np.float32), expected, atol=tolerance, rtol=tolerance)
    with pytest.raises(ValueError, match="pallas_tpu only"):
        ragged_paged_attention(q, packed, metadata, backend="xla", sm_scale=0.1, num_kv_heads=num_kv_heads)
