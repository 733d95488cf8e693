"""The Triton-lowered GPU kernel in Pallas' interpret mode vs the spec, and its Triton lowering."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.ragged_paged_attention.gpu import (
    ragged_paged_attention_gpu,
    resident_programs,
    step_kv_splits,
)
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec
from tests.kernels.conftest import REAL_SHAPES, abstract_step, check_kernel_config

# (page_size, head_dim, num_q_heads, num_kv_heads, dtype, kernel options): every page size, head dim,
# GQA ratio, dtype and the split / unsplit KV paths at least once; the full product is the slow sweep.
CI_CONFIGS = [
    (16, 64, 2, 2, jnp.float32, dict(block_rows=16, pages_per_chunk=1, num_kv_splits=1)),
    (32, 128, 6, 2, jnp.bfloat16, dict(block_rows=32, num_kv_splits=1)),
    (16, 128, 8, 2, jnp.float32, dict(block_rows=16, pages_per_chunk=2, num_kv_splits=4,
                                      min_chunks_per_split=1)),
    (32, 64, 3, 1, jnp.float32, dict(block_rows=16, num_kv_splits=2, min_chunks_per_split=1,
                                     sliding_window=40, soft_cap=5.0)),
    (16, 64, 12, 4, jnp.bfloat16, dict()),  # the defaults
    # head_dim not a power of two: read as 128 / 128 columns with the tail masked.
    (16, 80, 4, 2, jnp.float32, dict(block_rows=16, num_kv_splits=2, min_chunks_per_split=1)),
    (16, 96, 6, 2, jnp.bfloat16, dict(block_rows=16)),
]
SWEEP_CONFIGS = [(page, dim, 4 * ratio, 4, dtype, dict(num_kv_splits=splits))
                 for page, dim, ratio, dtype, splits in itertools.product(
                     (16, 32), (64, 128), (1, 3, 4), (jnp.float32, jnp.bfloat16), (1, 3))]


@pytest.mark.parametrize("config", CI_CONFIGS, ids=lambda c: f"p{c[0]}-d{c[1]}-h{c[2]}x{c[3]}-"
                         f"{jnp.dtype(c[4]).name}")
def test_gpu_kernel_matches_reference(config, check_kernel):
    """Decode, prefill, mixed, edge lengths and padding all match the spec."""
    check_kernel_config(check_kernel, ragged_paged_attention_gpu, *config, interpret=True)


@pytest.mark.slow
@pytest.mark.parametrize("config", SWEEP_CONFIGS)
def test_gpu_kernel_sweep(config, check_kernel):
    """The full page size x head dim x GQA ratio x dtype x KV split product."""
    check_kernel_config(check_kernel, ragged_paged_attention_gpu, *config, interpret=True)


def test_gpu_kernel_reads_stacked_layers(scenarios):
    """Tables offset into a [layers * pages] stack read the right layer."""
    (_, batch), = [s for s in scenarios(16, num_q_heads=4, num_kv_heads=2, head_dim=64,
                                        dtype=jnp.float32) if s[0] == "mixed"]
    other_layer = np.random.default_rng(7).standard_normal(batch.kv_pages.shape, np.float32)
    stacked = jnp.concatenate([jnp.asarray(other_layer), jnp.asarray(batch.kv_pages)])
    q, kv_pages, metadata = batch.attention_args()
    on_second_layer = metadata.on_pages_from(jnp.int32(batch.kv_pages.shape[0]), page_size=16)
    out = ragged_paged_attention_gpu(q, stacked, on_second_layer, sm_scale=0.125, block_rows=16, interpret=True)
    expected = ragged_paged_attention_spec(q, kv_pages, metadata, sm_scale=0.125)  # numpy: nothing to compile
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_dim", REAL_SHAPES)
@pytest.mark.parametrize("dtype,num_kv_splits", [(jnp.float32, 1), (jnp.bfloat16, None)])
def test_gpu_kernel_lowers_to_triton(num_q_heads, num_kv_heads, head_dim, dtype, num_kv_splits):
    """Pallas' Triton lowering accepts the kernel at real model shapes: one Triton custom call."""
    attend, args = abstract_step(
        functools.partial(ragged_paged_attention_gpu, sm_scale=0.1, sliding_window=64, soft_cap=30.0,
                          num_kv_splits=num_kv_splits),
        num_tokens=64, num_q_heads=num_q_heads, head_dim=head_dim, num_pages=64, page_size=16,
        kv_heads_x2=2 * num_kv_heads, max_num_seqs=8, pages_per_seq=16, dtype=dtype)
    text = attend.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 1


def test_gpu_kernel_float32_dots_are_ieee():
    """float32 dots ask for Precision.HIGHEST (Triton: IEEE), never the TF32 default."""
    attend, args = abstract_step(functools.partial(ragged_paged_attention_gpu, sm_scale=0.1), num_tokens=16,
                                 num_q_heads=4, head_dim=64, num_pages=8, page_size=16, kv_heads_x2=4,
                                 max_num_seqs=2, pages_per_seq=4, dtype=jnp.float32)
    jaxpr = str(jax.make_jaxpr(attend)(*args))
    assert jaxpr.count("dot_general") == 2
    assert jaxpr.count("precision=(Precision.HIGHEST, Precision.HIGHEST)") == 2


def test_gpu_kernel_splits_follow_capacity_and_real_blocks():
    """A step's split count fills the resident programs for its real blocks, within the bound."""
    capacity = resident_programs(num_warps=4, num_stages=2, chunk_tokens=64, block_rows=16,
                                 padded_head_dim=128, itemsize=2)
    assert capacity == 132 * 3  # (2 * 2 * 64 + 16) rows of 256 bytes: 3 programs' shared memory per SM
    splits = lambda blocks: int(step_kv_splits(jnp.array([blocks]), capacity=capacity,  # noqa: E731
                                               num_kv_heads=8, max_splits=16)[0])
    assert [splits(b) for b in (0, 1, 4, 32, 64, 1000)] == [16, 16, 13, 2, 1, 1]


@pytest.mark.parametrize("options,message", [
    (dict(block_rows=24), "block_rows: must be a power of two"),
    (dict(block_rows=16, pages_per_chunk=3), r"pages_per_chunk \* page_size: must be a power"),
    (dict(head_dim=320), "head_dim: at most 256"),
])
def test_gpu_kernel_rejects_non_power_of_two_tiles(options, message):
    """Tile sides Triton cannot use are refused with the field named."""
    head_dim = options.pop("head_dim", 64)
    q = jnp.zeros((16, 2, head_dim), jnp.float32)
    kv_pages = jnp.zeros((4, 16, 2, head_dim), jnp.float32)
    metadata = AttentionMetadata(jnp.zeros(16, jnp.int32), jnp.zeros(2, jnp.int32), jnp.zeros((2, 2), jnp.int32),
                                 jnp.zeros(3, jnp.int32), jnp.zeros(1, jnp.int32))
    with pytest.raises(ValueError, match=message):
        ragged_paged_attention_gpu(q, kv_pages, metadata, sm_scale=1.0, **options)
