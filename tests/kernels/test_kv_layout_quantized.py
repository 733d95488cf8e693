"""The packed quantized KV layout (kv_layout_quantized.py): where codes and scales sit, round trips, the tensor-parallel
row split, the merging write, and the bytes it saves against the bfloat16 packed layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.kv_quantization import quantize_rows, quantized_pool_dtype, row_scales
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape, physical_bytes
from pallas_kernels.ragged_paged_attention.kv_layout_quantized import (
    bytes_per_token_table,
    pack_quantized_pages,
    packed_quantized_shape,
    quantized_layout_for,
    unpack_quantized_pages,
    write_kv_packed_quantized,
)

# (num_kv_heads, head_dim, kv_cache_dtype, page_size, num_shards): combined [K | V] vectors and lane tiles, page
# sizes 4 (one quad) to 32, two shards.
CASES = [(3, 64, "int8", 16, 1), (2, 128, "fp8_e4m3", 8, 2), (1, 64, "int8", 4, 1), (4, 256, "fp8_e4m3", 32, 2)]


# Jitted once here (the engine runs it under jit): eagerly each of its ops compiled a program per shape.
quantize = jax.jit(quantize_rows, static_argnums=1)


def _stored(num_pages, page_size, num_kv_heads, head_dim, kv_cache_dtype, seed=0):
    values = np.random.default_rng(seed).standard_normal((num_pages, page_size, 2 * num_kv_heads, head_dim)) * 3.0
    return quantize(jnp.asarray(values, jnp.float32), quantized_pool_dtype(kv_cache_dtype))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"kv{c[0]}-d{c[1]}-{c[2]}-p{c[3]}-tp{c[4]}")
def test_pack_then_unpack_is_the_identity(case):
    num_kv_heads, head_dim, kv_cache_dtype, page_size, num_shards = case
    stored = _stored(5, page_size, num_kv_heads, head_dim, kv_cache_dtype)
    words = pack_quantized_pages(stored, num_shards)
    assert (words.shape, words.dtype) == packed_quantized_shape(5, page_size, num_kv_heads, head_dim, kv_cache_dtype,
                                                                num_shards)
    back = unpack_quantized_pages(words, num_kv_heads, head_dim, kv_cache_dtype, page_size, num_shards)
    np.testing.assert_array_equal(np.asarray(back), np.asarray(stored))


def test_codes_and_scales_sit_where_the_docstring_says():
    """Hand-placed: token t's code of vector v is byte t % 4 of word row (t // 4) * V + v; its head h's K / V scales
    are the low / high bfloat16 of word t * kv_heads + h after the code rows."""
    num_kv_heads, head_dim, page_size = 2, 128, 8
    stored = _stored(2, page_size, num_kv_heads, head_dim, "int8", seed=1)
    words = np.asarray(pack_quantized_pages(stored))
    layout = quantized_layout_for(num_kv_heads, head_dim, "int8", page_size)
    codes = np.asarray(stored)[..., :head_dim].view(np.uint8)
    scales = np.asarray(row_scales(stored))
    for page, token, head in [(0, 0, 0), (1, 5, 1), (1, 7, 0)]:
        for vector, row in [(2 * head, 2 * head), (2 * head + 1, 2 * head + 1)]:  # one lane tile: K_h, V_h
            word = words[page, (token // 4) * layout.vectors_per_token + vector]
            np.testing.assert_array_equal((word >> (8 * (token % 4))) & 0xFF, codes[page, token, row])
        scale_word = words[page, layout.code_rows + (token * num_kv_heads + head) // 128,
                           (token * num_kv_heads + head) % 128]
        as_float = lambda bits: np.array([bits << 16], np.uint32).view(np.float32)[0]  # noqa: E731
        assert as_float(scale_word & 0xFFFF) == scales[page, token, 2 * head]
        assert as_float(scale_word >> 16) == scales[page, token, 2 * head + 1]


def test_tensor_parallel_rows_are_shard_major():
    """Each shard's rows are the whole packed quantized page of exactly its own heads (runner/mesh.py splits rows)."""
    num_kv_heads, head_dim, page_size, num_shards = 8, 128, 16, 4
    stored = _stored(3, page_size, num_kv_heads, head_dim, "fp8_e4m3", seed=2)
    words = np.asarray(pack_quantized_pages(stored, num_shards))
    per_shard, host_stored = num_kv_heads // num_shards, np.asarray(stored)  # sliced on the host: no program each
    for shard, part in enumerate(np.split(words, num_shards, axis=1)):
        own = host_stored[:, :, 2 * per_shard * shard:2 * per_shard * (shard + 1)]
        np.testing.assert_array_equal(part, np.asarray(pack_quantized_pages(jnp.asarray(own))),
                                      err_msg=f"shard {shard}")


@pytest.mark.parametrize("num_shards", [1, 2])
def test_token_by_token_writes_merge_into_shared_words(num_shards):
    """Decode-style writes (one token per call, out of order, into words other tokens already hold) and one prefill
    write of several tokens of the same quad both end as the whole pool packed at once; padding goes to page 0."""
    num_kv_heads, head_dim, page_size = 2, 64, 8
    rng = np.random.default_rng(3)
    # Made and sliced on the host: an eager slice of a device array compiles a program per index.
    host_keys, host_values = rng.standard_normal((2, 24, num_kv_heads, head_dim)).astype(np.float32)
    keys, values = jnp.asarray(host_keys), jnp.asarray(host_values)
    slots = np.random.default_rng(0).permutation(np.arange(page_size, 4 * page_size))  # pages 1..3
    shape, dtype = packed_quantized_shape(4, page_size, num_kv_heads, head_dim, "int8", num_shards)
    one_by_one = jnp.zeros(shape, dtype)
    for i, slot in enumerate(slots):
        one_by_one = write_kv_packed_quantized(one_by_one, jnp.asarray(host_keys[i:i + 1]),
                                               jnp.asarray(host_values[i:i + 1]), jnp.asarray([slot]), "int8",
                                               page_size, num_shards)
    at_once = write_kv_packed_quantized(jnp.zeros(shape, dtype), keys, values, jnp.asarray(slots), "int8", page_size,
                                        num_shards)
    interleaved = np.stack([host_keys, host_values], axis=2).reshape(24, 2 * num_kv_heads, head_dim)
    pool = np.zeros((4, page_size, 2 * num_kv_heads, head_dim + 2), np.int8)
    pool[slots // page_size, slots % page_size] = np.asarray(quantize(jnp.asarray(interleaved), jnp.int8))
    expected = np.asarray(pack_quantized_pages(jnp.asarray(pool), num_shards))
    np.testing.assert_array_equal(np.asarray(one_by_one)[1:], expected[1:])
    np.testing.assert_array_equal(np.asarray(at_once)[1:], expected[1:])
    overwritten = write_kv_packed_quantized(at_once, jnp.asarray(-host_keys[:3]), jnp.asarray(host_values[:3]),
                                            jnp.asarray(slots[:3]), "int8", page_size,
                                            num_shards)  # a rewrite replaces, never adds
    rewritten = np.stack([-host_keys[:3], host_values[:3]], axis=2).reshape(3, -1, head_dim)
    pool[slots[:3] // page_size, slots[:3] % page_size] = np.asarray(quantize(jnp.asarray(rewritten), jnp.int8))
    np.testing.assert_array_equal(np.asarray(overwritten)[1:],
                                  np.asarray(pack_quantized_pages(jnp.asarray(pool), num_shards))[1:])


def test_bytes_per_token_against_bfloat16_packed():
    """Per shard, page 16 / 128 (hand-computed from page_rows = roundup(page / 4 * V + scale rows, 8))."""
    table = bytes_per_token_table((16, 128))
    assert table[("SmolLM2", 16)] == (512, 1024) and table[("SmolLM2", 128)] == (416, 1024)
    assert table[("Llama-3-8B tp1", 16)] == (2304, 4096) and table[("Llama-3-8B tp1", 128)] == (2080, 4096)
    assert table[("Llama-3-8B tp8", 16)] == (512, 512) and table[("Llama-3-8B tp8", 128)] == (288, 512)


@pytest.mark.parametrize("num_shards", [1, 2, 4, 8])
def test_cache_shape_is_tile_exact_per_shard(num_shards):
    shape, dtype = cache_shape(7, 16, 8, 128, jnp.int8, "packed_quantized", num_shards)
    rows = quantized_layout_for(8 // num_shards, 128, "int8", 16).page_rows
    assert shape == (7, num_shards * rows, 128) and dtype == jnp.uint32
    shard = (7, rows, 128)
    assert physical_bytes(shard, dtype, "tpu") == physical_bytes(shard, dtype, "cpu") == 7 * rows * 512


def test_bad_layouts_name_their_field():
    with pytest.raises(ValueError, match="page_size"):
        quantized_layout_for(2, 128, "int8", 6)
    with pytest.raises(ValueError, match="head_dim"):
        quantized_layout_for(2, 96, "int8", 16)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        quantized_layout_for(2, 128, "auto", 16)
    with pytest.raises(ValueError, match="dtype"):
        cache_shape(1, 16, 2, 128, jnp.bfloat16, "packed_quantized")
