"""The step's new K/V into their cache slots on TPU: one DMA per run of consecutive slots in a page.

XLA lowers a row scatter on TPU to a serial loop of small dynamic-update-slices. Here the wrapper
cuts the step's tokens into *runs*: maximal groups of consecutive tokens whose slots are consecutive
within one page (a prefill chunk is a few runs, one per page it touches; a decode is a run of one).
Each run is one async copy of [run_length, 2 * num_kv_heads, head_dim] from VMEM straight into its
page in HBM, all of a tile's runs in flight at once. The cache is aliased input -> output, so under a
donating jit nothing is copied. Padding tokens write into the null page 0, as everywhere else.
"""

import functools
from typing import Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float, Int, UInt32

from pallas_kernels.ragged_paged_attention.kv_layout_packed import pack_kv_pages, packed_layout_for
from pallas_kernels.ragged_paged_attention.vector_order import LANES

DEFAULT_TOKENS_PER_TILE = 128


def slot_runs(slots: Int[Array, " num_tokens"], page_size: int, tokens_per_tile: int):
    """Runs of consecutive slots inside one page and one tile, as fixed-size arrays.

    Returns (run_firsts [num_tokens]: first token of run r, real runs first; run_lens [num_tokens]: its
    length, 0 past the real runs; tile_runs [num_tiles + 1]: runs of tile t are
    tile_runs[t]:tile_runs[t + 1]).
    """
    num_tokens = slots.shape[0]
    tokens = jnp.arange(num_tokens)
    starts_run = ((tokens % tokens_per_tile == 0) | (slots % page_size == 0)
                  | (slots != jnp.roll(slots, 1) + 1))
    run_ids = jnp.cumsum(starts_run) - 1
    num_runs = run_ids[-1] + 1
    run_firsts = jnp.zeros(num_tokens, jnp.int32).at[jnp.where(starts_run, run_ids, num_tokens)].set(
        tokens, mode="drop")
    run_lens = jnp.zeros(num_tokens, jnp.int32).at[run_ids].add(1)
    num_tiles = -(-num_tokens // tokens_per_tile)
    tile_firsts = jnp.arange(num_tiles + 1) * tokens_per_tile
    tile_runs = jnp.where(tile_firsts < num_tokens, run_ids[jnp.minimum(tile_firsts, num_tokens - 1)], num_runs)
    return run_firsts, run_lens, tile_runs.astype(jnp.int32)


def _kernel(slots_ref, run_firsts_ref, run_lens_ref, tile_runs_ref,  # scalar prefetch (SMEM)
            new_kv_ref, _cache_in_ref, cache_ref, sems, *, page_size: int, rows: int):
    # rows: buffer rows per token (1 interleaved: [tokens, 2kv, d]; the packed layout's word rows).
    tile = pl.program_id(0)
    first_token = tile * (new_kv_ref.shape[0] // rows)

    def copy(run):
        token, length = run_firsts_ref[run], run_lens_ref[run]
        slot = slots_ref[token]
        return pltpu.make_async_copy(new_kv_ref.at[pl.ds((token - first_token) * rows, length * rows)],
                                     cache_ref.at[slot // page_size, pl.ds(slot % page_size * rows, length * rows)],
                                     sems.at[0])

    # All runs share one semaphore: start them all, then wait once per run with its own size.
    @pl.loop(tile_runs_ref[tile], tile_runs_ref[tile + 1])
    def _start(run):
        copy(run).start()

    @pl.loop(tile_runs_ref[tile], tile_runs_ref[tile + 1])
    def _wait(run):
        copy(run).wait()


@functools.partial(jax.jit, static_argnames=("tokens_per_tile", "interpret"))
def write_kv_pages_tpu(
    kv_pages: Union[Float[Array, "num_pages page_size kv_heads_x2 head_dim"], UInt32[Array, "num_pages rows lanes"]],
    k: Float[Array, "num_tokens num_kv_heads head_dim"],
    v: Float[Array, "num_tokens num_kv_heads head_dim"],
    slot_mapping: Int[Array, " num_tokens"],
    *,
    tokens_per_tile: int = DEFAULT_TOKENS_PER_TILE,
    interpret: Union[bool, pltpu.InterpretParams] = False,
) -> Union[Float[Array, "num_pages page_size kv_heads_x2 head_dim"], UInt32[Array, "num_pages rows lanes"]]:
    """write_kv_pages' contract (K at head 2h, V at 2h+1 of each slot) as a Mosaic kernel.

    kv_pages may also be the packed uint32 layout of kv_layout.py (k's dtype is then the cache's).
    Slots must be distinct except in the null page 0 (whose content is garbage by contract).
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    tokens_per_tile = min(tokens_per_tile, num_tokens)
    num_tiles = -(-num_tokens // tokens_per_tile)
    padded_tokens = num_tiles * tokens_per_tile
    new_kv = jnp.stack([k, v], axis=2).reshape(num_tokens, 2 * num_kv_heads, head_dim)
    if kv_pages.ndim == 3:  # packed: each token becomes its word rows, stacked [tokens * rows, 128]
        rows = packed_layout_for(num_kv_heads, head_dim, k.dtype).rows_per_token
        page_size = kv_pages.shape[1] // rows
        new_kv = pack_kv_pages(new_kv[:, None]).reshape(num_tokens * rows, LANES)
    else:
        rows, page_size = 1, kv_pages.shape[1]
        new_kv = new_kv.astype(kv_pages.dtype)
    pad = [(0, (padded_tokens - num_tokens) * rows)] + [(0, 0)] * (new_kv.ndim - 1)
    new_kv = jnp.pad(new_kv, pad)
    # Rows added to fill the last tile land in the null page, like any padding token.
    slots = jnp.pad(slot_mapping.astype(jnp.int32), (0, padded_tokens - num_tokens))
    runs = slot_runs(slots, page_size, tokens_per_tile)
    if isinstance(interpret, bool):
        interpret = pltpu.InterpretParams() if interpret else False
    return pl.pallas_call(
        functools.partial(_kernel, page_size=page_size, rows=rows),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(num_tiles,),
            in_specs=[pl.BlockSpec((tokens_per_tile * rows, *new_kv.shape[1:]),
                                   lambda tile, *_: (tile,) + (0,) * (new_kv.ndim - 1)),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA((1,))]),
        out_shape=jax.ShapeDtypeStruct(kv_pages.shape, kv_pages.dtype),
        # Inputs count the scalar-prefetch operands first: 0-3 slots and runs, 4 new_kv, 5 the cache.
        input_output_aliases={5: 0},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
        name="write_kv_pages_tpu",
    )(slots, *runs, new_kv, kv_pages)
