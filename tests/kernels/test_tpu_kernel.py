"""The Mosaic TPU kernel under the TPU interpreter (simulated DMAs and semaphores) vs the spec."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec
from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu
from tests.kernels.conftest import abstract_step, check_kernel_config, jit_one_shot

# (page_size, head_dim, num_q_heads, num_kv_heads, dtype, kernel options): every page size, head dim,
# GQA ratio and dtype at least once; the full product is the slow sweep below.
# The first of them (MHA, one page per chunk) runs in test_tpu_kernel_has_no_dma_races, under the race detector.
RACE_CHECKED_CONFIG = (16, 64, 2, 2, jnp.float32, dict(q_block_size=16, pages_per_chunk=1))
CI_CONFIGS = [
    (32, 128, 6, 2, jnp.bfloat16, dict(q_block_size=32)),
    (16, 128, 8, 2, jnp.float32, dict(q_block_size=32, pages_per_chunk=3)),
    (32, 64, 3, 1, jnp.float32, dict(q_block_size=16, sliding_window=40, soft_cap=5.0)),
]
SWEEP_CONFIGS = [(page, dim, 4 * ratio, 4, dtype, dict(q_block_size=16))
                 for page, dim, ratio, dtype in itertools.product(
                     (16, 32), (64, 128), (1, 3, 4), (jnp.float32, jnp.bfloat16))]


@pytest.mark.parametrize("config", CI_CONFIGS, ids=lambda c: f"p{c[0]}-d{c[1]}-h{c[2]}x{c[3]}-"
                         f"{jnp.dtype(c[4]).name}")
def test_tpu_kernel_matches_reference(config, check_kernel):
    """Decode, prefill, mixed, edge lengths and padding all match the spec."""
    check_kernel_config(check_kernel, ragged_paged_attention_tpu, *config, interpret=True)


@pytest.mark.slow
@pytest.mark.parametrize("config", SWEEP_CONFIGS)
def test_tpu_kernel_sweep(config, check_kernel):
    """The full page size x head dim x GQA ratio x dtype product."""
    check_kernel_config(check_kernel, ragged_paged_attention_tpu, *config, interpret=True)


def test_tpu_kernel_has_no_dma_races(check_kernel):
    """Decode, prefill, mixed, edge lengths and padding match the spec, and the interpreter's race detector finds no
    conflicting DMA/compute accesses to VMEM meanwhile (one compile serves both checks)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call

    params = pltpu.InterpretParams(detect_races=True, dma_execution_mode="on_wait")
    check_kernel_config(check_kernel, ragged_paged_attention_tpu, *RACE_CHECKED_CONFIG, interpret=params)
    races = interpret_pallas_call.races
    assert races is not None and not races.races_found


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tpu_kernel_lowers_to_mosaic(dtype, monkeypatch):
    """Pallas' Mosaic lowering accepts both kernels (TPU v5e rules); only libtpu's passes remain."""
    from jax._src.pallas.mosaic import tpu_info

    monkeypatch.setitem(tpu_info.registry, jax.devices()[0].device_kind, lambda: (
        tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion.TPU_V5E, 1)))
    attend, args = abstract_step(functools.partial(ragged_paged_attention_tpu, sm_scale=0.1, sliding_window=64,
                                                   soft_cap=30.0),
                                 num_tokens=64, num_q_heads=8, head_dim=128, num_pages=32, page_size=16,
                                 kv_heads_x2=4, max_num_seqs=4, pages_per_seq=8, dtype=dtype)
    lowered = attend.trace(*args).lower(lowering_platforms=("tpu",))
    # One lax.switch: decode-only (decode kernel), prefill-only (tile kernel), mixed (both).
    assert lowered.as_text().count("tpu_custom_call") == 4


def test_tpu_kernel_rejects_misaligned_blocks():
    """Block sizes that break the (8, 128) tiling are refused with the field named."""
    q = jnp.zeros((16, 2, 64), jnp.bfloat16)
    kv_pages = jnp.zeros((4, 16, 2, 64), jnp.bfloat16)
    metadata = AttentionMetadata(jnp.zeros(16, jnp.int32), jnp.zeros(2, jnp.int32), jnp.zeros((2, 2), jnp.int32),
                                 jnp.zeros(3, jnp.int32), jnp.zeros(1, jnp.int32))
    with pytest.raises(ValueError, match="q_block_size: must be a multiple of 16"):
        ragged_paged_attention_tpu(q, kv_pages, metadata, sm_scale=1.0, q_block_size=8)


def test_tile_ranges_skip_the_leading_decodes_of_a_mixed_step():
    """Told to start at sequence 2, the tile kernel's tiles begin there, and a tile holding only the leading decodes'
    rows gets an empty range (it fetches nothing)."""
    from pallas_kernels.ragged_paged_attention.tpu import _tile_sequence_ranges

    # Jitted: eagerly each of its ops compiled a program per shape (35 programs for the three calls).
    tile_ranges = jax.jit(_tile_sequence_ranges, static_argnums=(2, 3))
    cu_q_lens = jnp.asarray([0, 1, 2, 9, 10, 30, 30], jnp.int32)  # q rows 1, 1, 7, 1, 20; one padded sequence
    ranges = np.asarray(tile_ranges(cu_q_lens, jnp.asarray([5]), 4, 8, jnp.int32(2))).reshape(4, 2)
    assert ranges.tolist() == [[2, 3], [2, 5], [4, 5], [4, 5]]
    decodes_first = jnp.asarray([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 29], jnp.int32)  # 9 decodes, then 20 rows
    ranges = np.asarray(tile_ranges(decodes_first, jnp.asarray([10]), 4, 8, jnp.int32(9))).reshape(4, 2)
    assert ranges[0, 0] == ranges[0, 1]  # rows 0..7: decodes only
    assert ranges[1:].tolist() == [[9, 10]] * 3
    assert np.asarray(tile_ranges(cu_q_lens, jnp.asarray([5]), 4, 8)).reshape(4, 2)[0].tolist() == [0, 3]


def test_every_step_case_matches_the_spec_when_forced_on_stacked_layers(scenarios):
    """The mixed branch (leading decodes through the decode kernel, the rest through the tile kernel) is exact on every
    scenario, including those with no leading decode or nothing but decodes; the split picks the same rows. The pages
    are the second layer of a [layers * pages] stack (tables offset into it, pages left in HBM): both kernels read the
    right layer."""
    from pallas_kernels.ragged_paged_attention.tpu_step_cases import leading_decodes

    attend = jit_one_shot(functools.partial(ragged_paged_attention_tpu, sm_scale=0.125, q_block_size=16,
                                            case="mixed", interpret=True))
    # Jitted: eagerly each of their ops compiled a program per shape.
    on_pages_from = jax.jit(lambda metadata, first_page: metadata.on_pages_from(first_page, page_size=16))
    count_leading = jax.jit(leading_decodes)
    leading = {}
    for name, batch in scenarios(16, num_q_heads=4, num_kv_heads=2, head_dim=64, dtype=jnp.float32):
        q, kv_pages, metadata = batch.attention_args()
        other_layer = np.random.default_rng(7).standard_normal(batch.kv_pages.shape, np.float32)
        stacked = jnp.asarray(np.concatenate([other_layer, batch.kv_pages]))
        on_second_layer = on_pages_from(metadata, jnp.int32(batch.kv_pages.shape[0]))
        expected = ragged_paged_attention_spec(q, kv_pages, metadata, sm_scale=0.125)
        np.testing.assert_allclose(np.asarray(attend(q, stacked, on_second_layer)), expected, atol=2e-5, rtol=2e-5,
                                   err_msg=name)
        leading[name] = int(count_leading(metadata.cu_q_lens, metadata.num_seqs))
    assert leading == {"decode_edges": 5, "prefill": 0, "mixed": 1, "many_pages": 1, "no_sequences": 0}
    assert attend._cache_size() == 1, "one compile serves every scenario"  # pyright: ignore[reportAttributeAccessIssue]


def test_tile_kernel_walks_a_1k_chunk_in_compute_slices():
    """The default tile blocks (a 1,024-token KV chunk per DMA, attended in 256-token slices, slices past kv_len
    skipped): contexts of 1, 2 and 3 slices plus a page, a decode after a prefill, against the spec. The step starts
    with a prefill, so the switch would pick the tile kernel alone; forced here (case="general"), the program
    compiles that one interpreted kernel, not all four of the switch's branches."""
    from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch

    batch = make_ragged_batch([5, 33, 1], [600, 290, 17 + 768], num_q_heads=4, num_kv_heads=2, head_dim=128,
                              page_size=16, dtype=jnp.float32, num_tokens=48, max_num_seqs=4, seed=11)
    q, kv_pages, metadata = batch.attention_args()
    attend = jit_one_shot(functools.partial(ragged_paged_attention_tpu, sm_scale=0.1, case="general", interpret=True))
    out = attend(q, kv_pages, metadata)
    expected = ragged_paged_attention_spec(q, kv_pages, metadata, sm_scale=0.1)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5)
