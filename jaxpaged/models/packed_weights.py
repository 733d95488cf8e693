"""Weights stored as panels for the native CPU matmul (jaxpaged/kernels/cpu_native/packed_matmul.py).

On a CPU in float32 (and in bfloat16 where the CPU has AVX512-BF16), on one device per rank (runner/mesh.py
place_params), every matmul weight whose outer size is a whole number of panels and whose inner size is even is
packed once on the host, before it is placed: the decoder layers' projections, an untied lm_head, and a tied
embedding (by its transpose, [hidden, vocab], the vocabulary projection). The tied table is then stored only as
panels: a token's embedding is read out of them (`embedding_rows`), so packing costs no second copy of the
vocabulary. `matmul` (layers.py) runs the native kernel for any 3-D (packed) weight.
"""

from typing import Optional, Union

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.kernels.cpu_native.int8_bf16_matmul import pack_int8_pairs
from jaxpaged.kernels.cpu_native.packed_matmul import (
    PANEL_WIDTH,
    fills_whole_panels,
    pack_panels,
    packs_dtype,
    panel_columns,
)
from jaxpaged.kernels.cpu_native.vnni_matmul import pack_vnni, vnni_packed_shape
from jaxpaged.models.model_config import ModelConfig

EmbeddingTable = Union[Float[Array, "vocab hidden"], Float[Array, "vocab_panels hidden 16"]]
"""A tied embedding as loaded, or packed as the panels of its transpose."""


def packs_weights_on(platform: str, dtype, tp: int) -> bool:
    """Whether a rank on `platform` with weights in `dtype` split `tp` ways packs its matmul weights."""
    return platform == "cpu" and tp == 1 and packs_dtype(dtype)


def _matmul_shape(name: str, shape: tuple[int, ...], cfg: ModelConfig) -> Optional[tuple[int, int]]:
    """The [inner, outer] a parameter multiplies with (per layer for stacked weights), or None if it is no matmul
    weight (norms, biases, an untied embedding)."""
    if name.startswith("layers.expert_"):  # a mixture of experts' stacks, biases and scales: grouped, never packed
        return None
    if name.startswith("layers.") and len(shape) == 3:  # [layers, inner, outer]: every 2-D layer weight projects
        return shape[1], shape[2]
    if name == "lm_head":
        return shape[0], shape[1]
    if name == "embed" and cfg.tie_word_embeddings:
        return shape[1], shape[0]  # the vocabulary projection: [hidden, vocab]
    return None


def is_packed(name: str, shape: tuple[int, ...], cfg: ModelConfig) -> bool:
    """Whether a parameter of this logical shape is stored packed (when its rank packs weights at all). Checked as
    bfloat16, which also needs an even inner size, so the choice is the same in both dtypes (every real model's
    sizes are even)."""
    matmul_shape = _matmul_shape(name, shape, cfg)
    return matmul_shape is not None and fills_whole_panels(matmul_shape, jnp.bfloat16)


def packed_shape(name: str, shape: tuple[int, ...], cfg: ModelConfig, vnni: bool = False) -> tuple[int, ...]:
    """The stored shape of a packed parameter: [outer / 16, inner, 16] (`vnni`, an int8 projection for the native
    VNNI matmul: [outer / 16, ceil(inner / 4) + 1, 64]), behind the layer axis if stacked."""
    matmul_shape = _matmul_shape(name, shape, cfg)
    assert matmul_shape is not None, f"{name} is no matmul weight"
    inner, outer = matmul_shape
    layers = shape[:1] if name.startswith("layers.") else ()
    if vnni:
        return (*layers, *vnni_packed_shape(inner, outer))
    return (*layers, outer // PANEL_WIDTH, inner, PANEL_WIDTH)


def pack_param(name: str, host: np.ndarray, dtype, vnni: bool = False, pairs: bool = False) -> np.ndarray:
    """One host weight packed in `dtype` (the panel order differs per dtype): a layer's [inner, outer] projection, an
    lm_head, or a tied embedding [vocab, hidden] (packed by its transpose; the caller packs "embed" only when it is
    tied, is_packed says when). `vnni`: an int8 projection packed for the native VNNI matmul (vnni_matmul.py);
    `pairs`: for the native bfloat16-dot matmul (int8_bf16_matmul.py), the same shape as int8 panels."""
    if vnni:
        return pack_vnni(np.asarray(host, dtype=np.int8))
    if pairs:
        return pack_int8_pairs(np.asarray(host, dtype=np.int8))
    return pack_panels(np.asarray(host.T if name == "embed" else host, dtype=dtype))


def embedding_rows(embed: EmbeddingTable, token_ids: Int[Array, " tokens"]) -> Float[Array, "tokens hidden"]:
    """Rows of the embedding table, stored [vocab, hidden] or as the panels of its transpose (token t is column
    t % 16 of panel t // 16). Token ids are in range (inputs.py validates them; padding is 0)."""
    if embed.ndim == 2:
        return embed[token_ids]
    return panel_columns(embed, token_ids)
