"""The Mosaic kernels at real model shapes: interpreter numerics vs the spec, DMA races, OOB reads, lowering.

Few sequences with KV lengths up to 2k keep the TPU interpreter fast while every code path (multi-page
decode blocks, cross-sequence prefetch, long prefill chunks, padding rows, the SMEM-chunked calls) runs.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape
from pallas_kernels.ragged_paged_attention.kv_layout_packed import pack_kv_pages
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec
from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu, sequences_per_call
from tests.kernels.conftest import REAL_SHAPES, TOLERANCE, abstract_step, jit_one_shot


def _strict_interpreter() -> pltpu.InterpretParams:
    """DMAs land only at their wait, OOB reads raise, fresh VMEM is NaN: every ordering bug shows."""
    return pltpu.InterpretParams(detect_races=True, dma_execution_mode="on_wait", out_of_bounds_reads="raise",
                                 uninitialized_memory="nan")


# Jitted once here: eagerly each of the packing's ops compiled a program per shape (15 programs a packed case).
_pack = jax.jit(pack_kv_pages)


@functools.cache
def _strict_kernel(sm_scale: float, options: tuple):
    """The kernel under the strict interpreter with these options, jitted once for the file."""
    return jit_one_shot(functools.partial(ragged_paged_attention_tpu, sm_scale=sm_scale,
                                          interpret=_strict_interpreter(), **dict(options)))


def _check(batch, dtype, layout="interleaved", **options):
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call

    args = batch.attention_args()
    sm_scale = batch.q.shape[-1] ** -0.5
    q, kv_pages, metadata = args
    if layout == "packed":
        kv_pages, options = _pack(kv_pages), options | dict(num_kv_heads=kv_pages.shape[2] // 2)
    out = _strict_kernel(sm_scale, tuple(sorted(options.items())))(q, kv_pages, metadata)
    expected = ragged_paged_attention_spec(*args, sm_scale=sm_scale)
    tolerance = TOLERANCE[jnp.dtype(dtype).name]
    # float32 on the host: an eager astype of the device array would compile a program per shape.
    np.testing.assert_allclose(np.asarray(out).astype(np.float32), expected, atol=tolerance, rtol=tolerance)
    races = interpret_pallas_call.races
    assert races is not None and not races.races_found


# (shape, dtype, page_size, layout): every real shape, both dtypes and layouts, page 16 and a bigger page.
CASES = [((9, 3, 64), jnp.float32, 16, "interleaved"), ((32, 8, 128), jnp.bfloat16, 16, "packed"),
         ((16, 2, 128), jnp.bfloat16, 64, "packed"), ((9, 3, 64), jnp.bfloat16, 64, "packed")]
_ids = [f"h{s[0]}x{s[1]}-d{s[2]}-{jnp.dtype(d).name}-p{p}-{layout}" for s, d, p, layout in CASES]


@pytest.mark.parametrize("shape,dtype,page_size,layout", CASES, ids=_ids)
def test_decode_kernel_long_kv(shape, dtype, page_size, layout):
    """Decode step through the decode kernel: KV up to 2k in multi-page blocks, padded sequences.

    The step's branch is forced (case="decode"): left to the lax.switch, each program compiles both kernels in all
    three branches (4 interpreted kernels, 2.5x the compile) to run one. The switch's choice is checked on every
    scenario by test_tpu_kernel.py (test_tpu_kernel_matches_reference) and below on the SMEM-split calls."""
    num_q_heads, num_kv_heads, head_dim = shape
    batch = make_ragged_batch([1, 1, 1], [2048, 1, 700], num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                              head_dim=head_dim, page_size=page_size, dtype=dtype, num_tokens=8, max_num_seqs=5,
                              seed=3)
    _check(batch, dtype, layout, case="decode", pages_per_block=max(1, 256 // page_size))


@pytest.mark.parametrize("layout", ["interleaved", "packed"])
def test_decode_block_walked_in_compute_chunks(layout):
    """A 1k-token DMA block is attended in 256-token compute chunks (bounded VMEM): a sequence ending inside
    a chunk, one inside the block's first chunk, and one spanning two blocks agree with the spec."""
    batch = make_ragged_batch([1, 1, 1], [1500, 100, 700], num_q_heads=4, num_kv_heads=2, head_dim=128,
                              page_size=16, dtype=jnp.bfloat16, num_tokens=8, max_num_seqs=4, seed=7)
    _check(batch, jnp.bfloat16, layout, case="decode", pages_per_block=64)


@pytest.mark.parametrize("shape,dtype,page_size,layout", CASES[:2], ids=_ids[:2])
def test_general_kernel_long_prefill_mix(shape, dtype, page_size, layout):
    """A long prefill chunk late in a 2k context, decodes, and padding rows in one step, through the tile kernel (the
    prefill-only branch, forced as in test_decode_kernel_long_kv)."""
    num_q_heads, num_kv_heads, head_dim = shape
    batch = make_ragged_batch([29, 1, 1], [2048, 300, 33], num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                              head_dim=head_dim, page_size=page_size, dtype=dtype, num_tokens=32, max_num_seqs=4,
                              seed=4)
    _check(batch, dtype, layout, case="general", q_block_size=32, pages_per_chunk=256 // page_size)


@pytest.mark.parametrize("case", [None, "general"])
def test_tables_over_smem_budget_run_as_several_calls(case):
    """A block table bigger than the SMEM budget is split over sequence ranges, same result."""
    batch = make_ragged_batch([1, 5, 1, 1, 1], [40, 70, 1, 33, 17], num_q_heads=4, num_kv_heads=2, head_dim=64,
                              page_size=16, num_tokens=16, max_num_seqs=6, pages_per_seq=8, seed=5)
    budget = 4 * (128 + 4 * 128 + 2 * (8 + 2))  # fixed words + exactly two sequences' rows
    assert sequences_per_call(6, 8, 1, budget) == 2
    _check(batch, jnp.float32, case=case, q_block_size=16, smem_budget_bytes=budget)
    decodes = make_ragged_batch([1] * 5, [40, 70, 1, 33, 17], num_q_heads=4, num_kv_heads=2, head_dim=64,
                                page_size=16, num_tokens=16, max_num_seqs=6, pages_per_seq=8, seed=6)
    _check(decodes, jnp.float32, case=case, q_block_size=16, smem_budget_bytes=budget)


def test_smem_budget_refuses_a_row_that_cannot_fit():
    """One block-table row over the budget is a ValueError naming block_tables, not a compile failure."""
    with pytest.raises(ValueError, match="block_tables: one row of 200000 pages"):
        sequences_per_call(8, 200_000, 4, 512 * 1024)


def _lowering_cases() -> list:
    """Every real shape, every dtype on every layout in CI (4 lowerings); the rest of the shape x dtype x layout
    product in the slow sweep (`make tpu-compile` compiles them all with libtpu)."""
    in_ci = {((9, 3, 64), "float32", "interleaved"), ((9, 3, 64), "bfloat16", "packed"),
             ((32, 8, 128), "bfloat16", "interleaved"), ((16, 2, 128), "float32", "packed")}
    return [pytest.param(shape, dtype, layout, marks=[] if (shape, jnp.dtype(dtype).name, layout) in in_ci else
                         [pytest.mark.slow], id=f"{layout}-{jnp.dtype(dtype).name}-h{shape[0]}x{shape[1]}-d{shape[2]}")
            for layout in ("interleaved", "packed") for dtype in (jnp.float32, jnp.bfloat16) for shape in REAL_SHAPES]


@pytest.mark.parametrize("shape,dtype,layout", _lowering_cases())
def test_both_kernels_lower_to_mosaic(shape, dtype, layout, monkeypatch):
    """Pallas' Mosaic lowering accepts the decode and the tile kernel (v6e rules) at real shapes: one per branch of
    the step's case split (decode-only, prefill-only), both in the mixed one."""
    from jax._src.pallas.mosaic import tpu_info

    monkeypatch.setitem(tpu_info.registry, jax.devices()[0].device_kind, lambda: (
        tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion.TPU_V6E, 1)))
    num_q_heads, num_kv_heads, head_dim = shape
    attend, args = abstract_step(
        functools.partial(ragged_paged_attention_tpu, sm_scale=0.1, sliding_window=512, soft_cap=30.0,
                          num_kv_heads=num_kv_heads),
        num_tokens=128, num_q_heads=num_q_heads, head_dim=head_dim, num_pages=512, page_size=16,
        kv_heads_x2=2 * num_kv_heads, max_num_seqs=16, pages_per_seq=128, dtype=dtype)
    if layout == "packed":
        args = (args[0], jax.ShapeDtypeStruct(*cache_shape(512, 16, num_kv_heads, head_dim, dtype, "packed")),
                *args[2:])
    text = attend.trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 4
