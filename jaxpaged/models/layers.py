"""Building blocks of a Llama-family decoder: RMSNorm, RoPE, the gated MLP and paged attention.

`paged_attention` is the only caller of the attention backends (jaxpaged/kernels/attention_dispatch.py).
"""

import math
from collections.abc import Sequence
from typing import Optional, Union, cast

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention, write_kv
from jaxpaged.kernels.cpu_native.int8_bf16_matmul import int8_bf16_matmuls
from jaxpaged.kernels.cpu_native.packed_matmul import packed_int8_matmuls, packed_matmul, packed_matmuls
from jaxpaged.lora.projection import LoRAProjection, lora_delta
from jaxpaged.models.int8_activations import VnniW8A8Weight, W8A8Weight, vnni_w8a8_products, w8a8_product
from jaxpaged.models.int8_bf16_weights import Int8Bf16Weight
from jaxpaged.models.int8_weights import Int8Weight
from jaxpaged.models.int16_activations import VnniW8A16Weight, W8A16Weight, vnni_w8a16_products, w8a16_product
from jaxpaged.models.model_config import RopeScaling
from jaxpaged.models.yarn import YarnScaling, yarn_inverse_frequencies
from pallas_kernels.ragged_paged_attention.kv_layout import KVPages, tokens_per_page
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata


def rms_norm(x: Float[Array, "... dim"], weight: Float[Array, " dim"], eps: float,
             offset: float = 0.0) -> Float[Array, "... dim"]:
    """RMSNorm computed in float32, cast back to x's dtype (as HF does); scales by (offset + weight), Gemma's
    norms storing weight - 1."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return ((offset + weight.astype(jnp.float32)) * normed).astype(x.dtype)


def rope_inverse_frequencies(head_dim: int, theta: float,
                             scaling: Optional[Union[RopeScaling, YarnScaling]]) -> jnp.ndarray:
    """Per-pair inverse frequencies, with Llama 3 or YaRN scaling applied when configured (a host-side constant)."""
    if isinstance(scaling, YarnScaling):
        return jnp.asarray(yarn_inverse_frequencies(head_dim, theta, scaling))
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if scaling is None:
        return inv_freq
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept; the band between is interpolated smoothly.
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    interpolated = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = jnp.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return jnp.where(is_medium, interpolated, scaled)


RopeTables = tuple[Float[Array, "tokens half"], Float[Array, "tokens half"]]
"""(cos, sin) of every token's rotation angles: computed once per step and frequency set, shared by its layers."""


def rope_tables(positions: Int[Array, " tokens"], inv_freq: Float[Array, " half"], *,
                materialize: bool = False, scale: float = 1.0) -> RopeTables:
    """cos and sin of position * inv_freq (times `scale`: YaRN's attention factor), for a step's layers to share.

    `materialize`: keep them one computed pair. Left to itself XLA:CPU fuses the sincos into every unrolled layer's
    rotation and recomputes it per head and layer (a visible share of a prefill step; docs/performance.md), and
    optimization_barrier does not stop it (the CPU pipeline expands barriers before fusion). A conditional's result
    is always materialized, so the pair is computed under one whose branches are the same function. Only for
    unrolled CPU steps: a GPU conditional reads its predicate back on the host."""
    def tables(positions):
        angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
        if scale == 1.0:
            return jnp.cos(angles), jnp.sin(angles)
        return jnp.cos(angles) * scale, jnp.sin(angles) * scale
    if not materialize:
        return tables(positions)
    return jax.lax.cond(positions[0] >= 0, tables, tables, positions)


def apply_rope(x: Float[Array, "tokens heads head_dim"], tables: RopeTables) -> Float[Array, "tokens heads head_dim"]:
    """Rotate-half RoPE (HF layout: the first and second halves of a head form the pairs)."""
    cos, sin = tables[0][:, None, :], tables[1][:, None, :]
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)


MatmulWeight = Union[Float[Array, "_inner _outer"], Float[Array, "_panels _inner 16"], Int8Weight, W8A16Weight,
                     W8A8Weight, VnniW8A8Weight, VnniW8A16Weight, Int8Bf16Weight]
"""A weight [inner, outer], float32 packed into panels [outer / 16, inner, 16] (models/packed_weights.py), int8
values with per-column scales (models/int8_weights.py), those multiplied by inputs split into int8 digits
(models/int16_activations.py), or those with int8 activations (models/int8_activations.py), packed for the
native VNNI matmul or not, or int8 panels for the native bfloat16-dot matmul (models/int8_bf16_weights.py)."""


ProjectionWeight = Union[MatmulWeight, LoRAProjection]
"""A matmul weight, or one with the step's LoRA adapter slots beside it (lora/projection.py)."""


def matmul(x: Float[Array, "tokens inner"], weight: ProjectionWeight, out_dtype=None,
           num_rows: Optional[Int[Array, ""]] = None) -> Float[Array, "tokens _"]:
    """x @ weight: matmuls of one weight."""
    return matmuls(x, (weight,), out_dtype, num_rows)[0]


def matmuls(x: Float[Array, "tokens inner"], weights: Sequence[ProjectionWeight], out_dtype=None,
            num_rows: Optional[Int[Array, ""]] = None) -> tuple[Float[Array, "tokens _"], ...]:
    """x @ each weight, accumulated in float32, rounded to out_dtype (default: x's dtype): bfloat16 weights run the
    CPU's bfloat16 dot units (AMX, AVX512-BF16) with float32 sums, as HF's bfloat16 matmuls do; float32 is unchanged.
    3-D weights are packed into panels (models/packed_weights.py; float32, or bfloat16 with AVX512-BF16) and run the
    native CPU matmul, which rounds a bfloat16 result itself; packed weights of one dtype run as one native call (q, k
    and v, or gate and up: the products share the threads and x's rows while they are in cache, a few percent more
    GFLOP/s than separate calls; docs/performance.md). An int8 weight is (x @ values) * scale: packed into int8
    panels, by the native int8 matmul (one call for q, k and v, as above), else by XLA's dot (_int8_product); a
    W8A16 weight splits x's rows into two int8 digits for one int8 x int8 dot (int16_activations.w8a16_product); a
    w8a8 weight quantizes x's rows too and accumulates int8 x int8 in int32 (int8_activations.w8a8_product; packed
    for VNNI, one native call for all of them, int8_activations.vnni_w8a8_products; W8A16 packed for VNNI:
    int16_activations.vnni_w8a16_products; int8 packed for the bfloat16-dot matmul: int8_bf16_matmuls, x rounded to
    bfloat16).
    `num_rows`: rows from it on are padding, which the native matmul skips (their results are zeros there; XLA's dot
    computes them as it must, static shapes)."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if any(isinstance(weight, LoRAProjection) for weight in weights):  # base products, then each row's adapter's
        bases = [weight.base if isinstance(weight, LoRAProjection) else weight for weight in weights]
        products = matmuls(x, bases, out_dtype, num_rows)  # rounded first, as PEFT adds to the base layer's output
        return tuple((product.astype(jnp.float32) + lora_delta(x, weight)).astype(out_dtype)
                     if isinstance(weight, LoRAProjection) else product for product, weight in zip(products, weights))
    weights = cast(Sequence[MatmulWeight], weights)  # none is a LoRAProjection past the branch above
    floats = [weight for weight in weights
              if not isinstance(weight, (Int8Weight, W8A16Weight, W8A8Weight, VnniW8A8Weight, VnniW8A16Weight,
                                         Int8Bf16Weight))]
    int8s = [weight for weight in weights if isinstance(weight, Int8Weight)]
    vnnis = [weight for weight in weights if isinstance(weight, VnniW8A8Weight)]
    vnni_digits = [weight for weight in weights if isinstance(weight, VnniW8A16Weight)]
    bf16_dots = [weight for weight in weights if isinstance(weight, Int8Bf16Weight)]
    if bf16_dots and len(bf16_dots) == len(weights):
        products = int8_bf16_matmuls(x, [w.panels for w in bf16_dots], [w.scale for w in bf16_dots], num_rows)
    elif vnnis and len(vnnis) == len(weights):
        products = vnni_w8a8_products(x, vnnis, num_rows)
    elif vnni_digits and len(vnni_digits) == len(weights):
        products = vnni_w8a16_products(x, vnni_digits, num_rows)
    elif int8s and len(int8s) == len(weights) and all(weight.values.ndim == 3 for weight in int8s):
        products = packed_int8_matmuls(x, [w.values for w in int8s], [w.scale for w in int8s], num_rows)
    elif floats and len(floats) == len(weights) and all(w.ndim == 3 for w in floats) and len(
            {w.dtype for w in floats}) == 1:
        products = packed_matmuls(x, floats, out_dtype, num_rows)
    else:
        products = tuple(_one_product(x, weight, out_dtype, num_rows) for weight in weights)
    return tuple(product.astype(out_dtype) for product in products)


def _one_product(x: Float[Array, "tokens inner"], weight: MatmulWeight, out_dtype,
                 num_rows: Optional[Int[Array, ""]]) -> Float[Array, "tokens _"]:
    """x @ weight alone, by the kernel its form asks for."""
    if isinstance(weight, W8A8Weight):
        return w8a8_product(x, weight)
    if isinstance(weight, VnniW8A8Weight):
        return vnni_w8a8_products(x, [weight], num_rows)[0]
    if isinstance(weight, VnniW8A16Weight):
        return vnni_w8a16_products(x, [weight], num_rows)[0]
    if isinstance(weight, Int8Bf16Weight):
        return int8_bf16_matmuls(x, [weight.panels], [weight.scale], num_rows)[0]
    if isinstance(weight, W8A16Weight):
        return w8a16_product(x, weight)
    if isinstance(weight, Int8Weight):
        if weight.values.ndim == 3:
            return packed_int8_matmuls(x, [weight.values], [weight.scale], num_rows)[0]
        return _int8_product(x, weight)
    if weight.ndim == 3:
        return packed_matmul(x, weight, out_dtype, num_rows)
    return jnp.dot(x, weight, preferred_element_type=jnp.float32)


def _int8_product(x: Float[Array, "tokens inner"], weight: Int8Weight) -> Float[Array, "tokens outer"]:
    """x @ (values * scale) as (x @ values) * scale in float32. NOTE: the scale multiplies the [tokens, outer]
    product, not the [inner, outer] weight: XLA fuses the int8 convert into the dot's operand read, so the weight's
    bytes cross memory once, as int8, and no dequantized copy is made."""
    product = jnp.dot(x, weight.values.astype(x.dtype), preferred_element_type=jnp.float32)
    return product * weight.scale


def gated_mlp(x: Float[Array, "tokens hidden"], gate: ProjectionWeight, up: ProjectionWeight, down: ProjectionWeight,
              activation: str = "silu", num_rows: Optional[Int[Array, ""]] = None) -> Float[Array, "tokens hidden"]:
    """Gated feed-forward down(act(gate(x)) * up(x)): SwiGLU ("silu"), or GeGLU with tanh GELU ("gelu_tanh");
    `num_rows` as for matmul."""
    gated, up_projected = matmuls(x, (gate, up), num_rows=num_rows)
    gated = jax.nn.silu(gated) if activation == "silu" else jax.nn.gelu(gated, approximate=True)
    return matmul(gated * up_projected, down, num_rows=num_rows)


def paged_attention(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    k: Float[Array, "num_tokens num_kv_heads head_dim"],
    v: Float[Array, "num_tokens num_kv_heads head_dim"],
    kv_pages: KVPages,
    first_page: Int[Array, ""],
    metadata: AttentionMetadata,
    layer_is_sliding: Optional[Bool[Array, ""]] = None,
    *,
    backend: str,
    sliding_window: Optional[int] = None,
    sm_scale: Optional[float] = None,
    soft_cap: Optional[float] = None,
    native_decode: bool = True,
    kv_cache_dtype: str = "auto",
    page_size: Optional[int] = None,
    sinks: Optional[Float[Array, " num_q_heads"]] = None,
) -> tuple[Float[Array, "num_tokens num_q_heads head_dim"], KVPages]:
    """Write this step's K/V into their slots, then attend over each sequence's pages.

    kv_pages may hold every layer's pages stacked on the first axis; first_page (layer * pages per layer)
    moves the step's slots and block tables onto this layer's part, so no per-layer copy is ever made. It is
    either layout of kv_layout.py (the packed one for pallas_tpu only). `layer_is_sliding` (traced, per layer)
    picks between sliding_window and full attention in models that alternate them (Gemma). `native_decode`: the
    start-up plan's choice of the native CPU attention kernel ("xla" backend only). `kv_cache_dtype` / `page_size`:
    how a uint32 pool is laid out (a quantized one is pallas_tpu's packed quantized layout, whose rows do not say the
    page size); interleaved pools say it themselves. `sinks`: the layer's attention sinks (gpt-oss), float32
    [num_q_heads] (this shard's heads under tensor parallelism), one logit per q head in the softmax's denominator
    only; None: none.
    """
    # Slots count tokens: the packed layout's axis 1 counts word rows (2 per token at 2 KV heads of 128 in bfloat16).
    packed_quantized = kv_pages.ndim == 3 and kv_cache_dtype != "auto"
    page_tokens = page_size if packed_quantized else tokens_per_page(kv_pages, k.shape[1], k.shape[2], q.dtype)
    if page_tokens is None:
        raise ValueError("page_size: required with the packed quantized KV layout")
    metadata = metadata.on_pages_from(first_page, page_tokens)
    kv_pages = write_kv(kv_pages, k, v, metadata, backend=backend, kv_cache_dtype=kv_cache_dtype, page_size=page_size)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale

    def attend(window: Optional[int]):
        return ragged_paged_attention(q, kv_pages, metadata, backend=backend, sm_scale=scale, soft_cap=soft_cap,
                                      sliding_window=window, num_kv_heads=k.shape[1], native_decode=native_decode,
                                      kv_cache_dtype=kv_cache_dtype, page_size=page_size, sinks=sinks)

    if layer_is_sliding is None or sliding_window is None:
        return attend(sliding_window), kv_pages
    # Local and global layers share one scanned body: both attention variants are compiled once, each layer
    # runs one. The KV write stays outside the cond, so the cache is only read inside it (no copy).
    return jax.lax.cond(layer_is_sliding, lambda: attend(sliding_window), lambda: attend(None)), kv_pages
