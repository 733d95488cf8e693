"""The step's new K/V into their cache slots on TPU: one DMA per token, the cache updated in place.

XLA lowers a row scatter on TPU to a serial loop of small dynamic-update-slices; here every token's
[2 * num_kv_heads, head_dim] row is one async copy from VMEM straight into its slot in HBM, all of a
tile in flight at once. The cache is aliased input -> output, so under a donating jit nothing is
copied. Padding tokens write into the null page 0, as everywhere else.
"""

import functools
from typing import Union

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float, Int

DEFAULT_TOKENS_PER_TILE = 128


def _kernel(slots_ref, new_kv_ref, _cache_in_ref, cache_ref, sems, *, page_size: int):
    tokens_per_tile = new_kv_ref.shape[0]
    first_token = pl.program_id(0) * tokens_per_tile

    def copy(token):
        slot = slots_ref[first_token + token]
        return pltpu.make_async_copy(new_kv_ref.at[token],
                                     cache_ref.at[slot // page_size, slot % page_size], sems.at[0])

    # All of the tile's copies share one semaphore (same size each): start them all, then wait
    # once per copy, so every row is in flight together.
    @pl.loop(0, tokens_per_tile)
    def _start(token):
        copy(token).start()

    @pl.loop(0, tokens_per_tile)
    def _wait(token):
        copy(token).wait()


@functools.partial(jax.jit, static_argnames=("tokens_per_tile", "interpret"))
def write_kv_pages_tpu(
    kv_pages: Float[Array, "num_pages page_size kv_heads_x2 head_dim"],
    k: Float[Array, "num_tokens num_kv_heads head_dim"],
    v: Float[Array, "num_tokens num_kv_heads head_dim"],
    slot_mapping: Int[Array, " num_tokens"],
    *,
    tokens_per_tile: int = DEFAULT_TOKENS_PER_TILE,
    interpret: Union[bool, pltpu.InterpretParams] = False,
) -> Float[Array, "num_pages page_size kv_heads_x2 head_dim"]:
    """write_kv_pages' contract (K at head 2h, V at 2h+1 of each slot) as a Mosaic kernel."""
    num_pages, page_size, kv_heads_x2, head_dim = kv_pages.shape
    num_tokens = k.shape[0]
    tokens_per_tile = min(tokens_per_tile, num_tokens)
    num_tiles = -(-num_tokens // tokens_per_tile)
    padded_tokens = num_tiles * tokens_per_tile
    new_kv = jnp.stack([k, v], axis=2).reshape(num_tokens, kv_heads_x2, head_dim)
    new_kv = jnp.pad(new_kv.astype(kv_pages.dtype), ((0, padded_tokens - num_tokens), (0, 0), (0, 0)))
    # Rows added to fill the last tile land in the null page, like any padding token.
    slots = jnp.pad(slot_mapping.astype(jnp.int32), (0, padded_tokens - num_tokens))
    if isinstance(interpret, bool):
        interpret = pltpu.InterpretParams() if interpret else False
    return pl.pallas_call(
        functools.partial(_kernel, page_size=page_size),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(num_tiles,),
            in_specs=[pl.BlockSpec((tokens_per_tile, kv_heads_x2, head_dim),
                                   lambda tile, *_: (tile, 0, 0)),
                      pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA((1,))]),
        out_shape=jax.ShapeDtypeStruct(kv_pages.shape, kv_pages.dtype),
        # Inputs count the scalar-prefetch slots first: 0 slots, 1 new_kv, 2 the cache.
        input_output_aliases={2: 0},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
        name="write_kv_pages_tpu",
    )(slots, new_kv, kv_pages)
