"""Writing a step's K/V into the paged cache: every backend's write is bit-exact."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxpaged.kernels.attention_dispatch import write_kv
from jaxpaged.kernels.xla_attention import write_kv_pages
from pallas_kernels.ragged_paged_attention.kv_write_tpu import write_kv_pages_tpu
from pallas_kernels.ragged_paged_attention.metadata import empty_attention_metadata
from pallas_kernels.ragged_paged_attention.spec import write_kv_spec


def _step(dtype, num_tokens=40, num_padding=5, seed=0):
    """A cache, new K/V and distinct slots; the last tokens are padding aimed at the null page."""
    rng = np.random.default_rng(seed)
    kv_pages = rng.standard_normal((10, 16, 6, 64)).astype(dtype)
    k, v = rng.standard_normal((2, num_tokens, 3, 64)).astype(dtype)
    slots = rng.choice(np.arange(16, 160), num_tokens, replace=False).astype(np.int32)
    slots[num_tokens - num_padding:] = np.arange(num_padding)  # null page 0
    return [jnp.asarray(a) for a in (kv_pages, k, v, slots)]


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("tokens_per_tile", [16, 128])
def test_tpu_kv_write_is_bit_exact(dtype, tokens_per_tile):
    """The Mosaic write (TPU interpreter) puts K at 2h and V at 2h+1 of each slot; nothing else moves."""
    args = _step(dtype)
    out = write_kv_pages_tpu(*args, tokens_per_tile=tokens_per_tile, interpret=True)
    assert out.dtype == args[0].dtype
    np.testing.assert_array_equal(np.asarray(out), write_kv_spec(*args))


@pytest.mark.parametrize("backend", ["xla", "pallas_gpu", "pallas_tpu", "auto"])
def test_write_kv_every_backend_matches_scatter(backend):
    """The backend switch's write equals XLA's scatter bit for bit (outside the garbage null page)."""
    args = _step(np.float32, seed=1)
    kv_pages, k, v, slots = args
    metadata = dataclasses.replace(empty_attention_metadata(len(slots), 1, 1), slot_mapping=slots)
    out = np.asarray(write_kv(kv_pages, k, v, metadata, backend=backend))
    expected = np.asarray(write_kv_pages(*args))
    np.testing.assert_array_equal(out[1:], expected[1:])


def test_tpu_kv_write_lowers_to_mosaic_in_place(monkeypatch):
    """Pallas' Mosaic lowering accepts the write kernel, and its output aliases the cache operand."""
    from jax._src.pallas.mosaic import tpu_info

    monkeypatch.setitem(tpu_info.registry, jax.devices()[0].device_kind, lambda: (
        tpu_info.get_tpu_info_for_chip(tpu_info.ChipVersion.TPU_V5E, 1)))
    shapes = [jax.ShapeDtypeStruct(s, d) for s, d in (((64, 16, 8, 128), jnp.bfloat16),
                                                      ((256, 4, 128), jnp.bfloat16),
                                                      ((256, 4, 128), jnp.bfloat16),
                                                      ((256,), jnp.int32))]
    text = jax.jit(write_kv_pages_tpu).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text
    # The kernel's output IS its cache operand: XLA must not allocate (or copy) a second cache.
    assert "output_operand_aliases = [#stablehlo.output_operand_alias<" in text


def test_tpu_kv_write_batches_runs_of_slots():
    """A prefill chunk is one DMA per page it touches, a decode one DMA; tile edges cut runs too."""
    from pallas_kernels.ragged_paged_attention.kv_write_tpu import slot_runs

    # 20-token chunk from slot 40 (pages 2, 3, 4 of 16), two decodes, three padding tokens.
    slots = np.concatenate([np.arange(40, 60), [95, 130], [0, 0, 0]]).astype(np.int32)
    # Jitted: eagerly each of its ops compiled a program per shape (36 programs).
    runs_of = jax.jit(slot_runs, static_argnums=(1, 2))
    firsts, lens, tile_runs = (np.asarray(a) for a in runs_of(jnp.asarray(slots), 16, 16))
    num_runs = int(tile_runs[-1])
    assert list(zip(firsts[:num_runs], lens[:num_runs])) == [(0, 8), (8, 8), (16, 4), (20, 1), (21, 1),
                                                             (22, 1), (23, 1), (24, 1)]
    assert list(tile_runs) == [0, 2, num_runs]  # tile 0: tokens 0-15; tile 1: 16-24


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_tpu_kv_write_contiguous_chunks_are_bit_exact(dtype):
    """Runs crossing pages and tiles, next to decodes and null-page padding: the scatter's result."""
    rng = np.random.default_rng(3)
    kv_pages = jnp.asarray(rng.standard_normal((12, 16, 4, 64)).astype(dtype))
    k, v = (jnp.asarray(a) for a in rng.standard_normal((2, 48, 2, 64)).astype(dtype))
    slots = jnp.asarray(np.concatenate([np.arange(21, 58), [70, 130, 160], [0] * 8]).astype(np.int32))
    out = write_kv_pages_tpu(kv_pages, k, v, slots, tokens_per_tile=16,
                             interpret=pltpu.InterpretParams(detect_races=True, dma_execution_mode="on_wait"))
    np.testing.assert_array_equal(np.asarray(out)[1:], write_kv_spec(kv_pages, k, v, slots)[1:])


@pytest.mark.parametrize("num_kv_heads,head_dim,dtype", [(3, 64, jnp.bfloat16), (2, 128, jnp.bfloat16),
                                                         (3, 64, np.float32)])
def test_tpu_kv_write_packed_layout_is_bit_exact(num_kv_heads, head_dim, dtype):
    """Into the packed uint32 layout: the packed image of the interleaved scatter's result."""
    from pallas_kernels.ragged_paged_attention.kv_layout_packed import pack_kv_pages

    pack = jax.jit(pack_kv_pages)  # eagerly each of its ops compiled a program per shape
    rng = np.random.default_rng(4)
    kv_pages = jnp.asarray(rng.standard_normal((12, 16, 2 * num_kv_heads, head_dim)).astype(dtype))
    k, v = (jnp.asarray(a) for a in rng.standard_normal((2, 40, num_kv_heads, head_dim)).astype(dtype))
    slots = jnp.asarray(np.concatenate([np.arange(21, 50), [70, 130, 160], [0] * 8]).astype(np.int32))
    out = write_kv_pages_tpu(pack(kv_pages), k, v, slots, tokens_per_tile=16,
                             interpret=pltpu.InterpretParams(detect_races=True, dma_execution_mode="on_wait"))
    expected = pack(jnp.asarray(write_kv_spec(kv_pages, k, v, slots)))
    np.testing.assert_array_equal(np.asarray(out)[1:], np.asarray(expected)[1:])
