"""The decoder every registered family runs (models/registry.py): one Flax NNX model over a ragged batch and a
paged KV cache. ModelConfig's variant fields, set by a family's config reader (models/families/), switch the parts
that differ on (Gemma's norms, caps and windows); a family with its own MLP block subclasses it (feed_forward).

Layer weights are stacked on a leading axis and the layers run under `lax.scan` (one layer body to compile), or
on the CPU stored per layer and unrolled (DecoderLayers says why). Every layer's KV pages live in one array
[num_layers * num_blocks, block_size, 2 * num_kv_heads, head_dim] that the layers carry and update in place.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int, Shaped, UInt32

from jaxpaged.lora.projection import LoRAProjection, row_slot_one_hot
from jaxpaged.lora.slot_names import lora_a_name, lora_b_name
from jaxpaged.models.int8_activations import VnniW8A8Weight, W8A8Weight
from jaxpaged.models.int8_bf16_weights import Int8Bf16Weight
from jaxpaged.models.int8_weights import Int8Weight, scale_name, scale_shapes
from jaxpaged.models.int16_activations import VnniW8A16Weight, W8A16Weight
from jaxpaged.models.layers import (
    RopeTables,
    apply_rope,
    gated_mlp,
    matmul,
    matmuls,
    rms_norm,
    rope_inverse_frequencies,
    rope_tables,
)
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.packed_weights import embedding_rows, is_packed, packed_shape
from jaxpaged.models.param_shapes import param_shapes
from pallas_kernels.bfloat16_bits import from_bits, to_bits
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata

KVCache = Union[Shaped[Array, "layers blocks block_size kv_heads_x2 head_dim"],
                UInt32[Array, "layers blocks rows lanes"]]
"""Every layer's pages stacked on axis 0, in the runner's layout (kv_layout.py: floats, bfloat16 bits or packed)."""


LayerWeight = Union[jax.Array, list[jax.Array]]
"""One layer weight of every layer: stacked on a leading layer axis, or a list with one array per layer."""


def unroll_layers_on(platform: str) -> bool:
    """Whether a step on `platform` should unroll the decoder layers over per-layer weights (DecoderLayers)."""
    return platform == "cpu"


class DecoderLayers(nnx.Module):
    """All decoder layers' weights, in the arrangement the platform runs fastest.

    Stacked (GPU, TPU): each weight stacked over a leading layer axis; the layers run under `lax.scan`, so XLA
    compiles one layer body. bfloat16 stacks are held as their uint16 bits: XLA has no bfloat16 dynamic-slice on
    the CPU, and slicing stored integers and bitcasting the slice costs nothing anywhere.

    Per layer (CPU, `unroll_layers_on`): one array per layer and weight; the step unrolls the layers. XLA:CPU
    materialises every dynamic-slice the scan takes of a stacked weight, so each step copied all weights once (about
    a fifth of a float32 decode step). Unrolled, each matmul reads its weight in place: faster decode and prefill
    steps in both dtypes. The cost is compile time: the step holds num_layers layer bodies (a longer warm-up, cold
    and from the persistent compilation cache; figures: docs/performance.md).
    """

    def __init__(self, weights: dict[str, LayerWeight]):
        self.names = tuple(sorted(weights))
        per_layer = {name: value for name, value in weights.items() if isinstance(value, list)}
        self.per_layer = bool(per_layer)
        if per_layer:
            num_layers = len(per_layer[self.names[0]])
            self.layers = nnx.List([nnx.Dict({name: nnx.Param(value[index]) for name, value in per_layer.items()})
                                    for index in range(num_layers)])
        for name, value in weights.items():
            if not isinstance(value, list):
                setattr(self, name, nnx.Param(to_bits(value)))

    def stacked(self) -> dict[str, jax.Array]:
        """The stored stacked weights as a dict, ready to be scanned over (`one_layer` gives a slice's values)."""
        return {name: getattr(self, name)[...] for name in self.names}

    @staticmethod
    def one_layer(scanned: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """One layer's weights from a slice of `stacked()`."""
        return {name: from_bits(value) for name, value in scanned.items()}

    def layer(self, index: int) -> dict[str, jax.Array]:
        """Layer `index`'s weights, when they are stored per layer."""
        return {name: param[...] for name, param in self.layers[index].items()}

    def num_slots(self) -> int:
        """The leading axis of the per-layer weights (LoRA slots: max_loras + 1)."""
        if self.per_layer:
            return self.layers[0][self.names[0]][...].shape[0]
        return getattr(self, self.names[0])[...].shape[1]


class LlamaForCausalLM(nnx.Module):
    """Decoder-only transformer; logits only for the rows that are sampled."""

    def __init__(self, cfg: ModelConfig, params: dict[str, LayerWeight], packed: bool = False,
                 int8_matmul: Optional[str] = None):
        """`params`: the loaders' flat names; layer weights stacked, or listed per layer (DecoderLayers).
        `packed`: the matmul weights that pack are panels for the native CPU matmul (packed_weights.py). An int8
        projection comes with its scales under scale_name (int8_weights.py) and multiplies as `int8_matmul` says
        (runner/startup.py StartupPlan.int8_matmul): "panels": its values are int8 panels for the native int8
        matmul; "int16 digits": its inputs are split into two int8 digits (int16_activations.py); "w8a8": its
        inputs are quantized per token (int8_activations.py); "vnni w8a8": those, packed for the native VNNI matmul
        (vnni_matmul.py); "vnni digits": int16 digits on the native VNNI matmul; "bf16 panels": int8 panels in
        bfloat16 pair order for the native bfloat16-dot matmul (int8_bf16_weights.py); "xla" (or None): XLA's
        fused-convert dot."""
        packed_int8 = int8_matmul in ("panels", "vnni w8a8", "vnni digits", "bf16 panels")
        expected = param_shapes(cfg) | scale_shapes(cfg, set(params))
        if set(params) != set(expected):
            raise ValueError(f"params: expected names {sorted(expected)}, got {sorted(params)}")
        for name, shape in expected.items():
            value = params[name]
            got = (len(value), *value[0].shape) if isinstance(value, list) else tuple(value.shape)
            quantized = scale_name(name) in params
            if (packed_int8 if quantized else packed) and is_packed(name, shape, cfg):
                shape = packed_shape(name, shape, cfg, vnni=quantized and int8_matmul in ("vnni w8a8", "vnni digits"))
            if got != shape:
                raise ValueError(f"params[{name!r}]: expected shape {shape}, got {got}")
        self.cfg = cfg
        self.int8_matmul = int8_matmul
        self.embed = nnx.Param(params["embed"])
        self.final_norm = nnx.Param(params["final_norm"])
        self.lm_head = nnx.Param(params["lm_head"]) if "lm_head" in params else None
        prefix = "layers."
        self.layers = DecoderLayers({k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)})
        self.lora: Optional[DecoderLayers] = None
        """LoRA adapter slots (lora/slots.py), attached by the runner with enable_lora: per target projection
        "lora_a.<name>" [slots, rank, in] and "lora_b.<name>" [slots, out, rank] of every layer."""

    def __call__(self, kv_cache: KVCache,
                 token_ids: Int[Array, " num_tokens"], positions: Int[Array, " num_tokens"],
                 metadata: AttentionMetadata, sample_indices: Int[Array, " max_num_seqs"], *, attend: Callable,
                 ) -> tuple[Float[Array, "max_num_seqs vocab"], KVCache]:
        """Run one ragged step; returns (logits of the sampled rows in float32, the updated kv_cache).

        `attend(q, k, v, kv_pages, first_page, metadata, layer_is_sliding, sliding_window=..., sm_scale=...,
        soft_cap=...)` writes the step's K/V and attends:
        layers.paged_attention bound to a backend, wrapped per shard by the runner under tensor parallelism.
        """
        x, kv_cache = self.hidden_states(kv_cache, token_ids, positions, metadata, attend=attend)
        # NOTE: only the sampled rows reach the final norm and the vocabulary projection.
        return self.logits(x[sample_indices]), kv_cache

    def hidden_states(self, kv_cache: KVCache, token_ids: Int[Array, " num_tokens"],
                      positions: Int[Array, " num_tokens"], metadata: AttentionMetadata, *, attend: Callable,
                      group_tables: Any = None, kv_placement: Optional[tuple[tuple[int, int], ...]] = None,
                      lora_slots: Optional[Int[Array, " num_tokens"]] = None,
                      ) -> tuple[Float[Array, "num_tokens hidden"], KVCache]:
        """The decoder layers of one ragged step: (every token's last hidden state, the updated kv_cache). Rows after
        the step's real tokens (metadata.cu_q_lens[-1]) are padding: the native CPU matmul skips them.
        KV layer groups (runner/kv_spec.py): `kv_placement` gives each layer's (group, pool slot), `group_tables`
        (runner/batch.py GroupTables) each group's block tables and slots; without them layer i is slot i of the one
        table. `lora_slots`: each row's LoRA adapter slot (0: none), read when the model has adapter slots
        (self.lora)."""
        cfg = self.cfg
        num_layers = cfg.num_layers
        num_slots, num_blocks = kv_cache.shape[:2]
        kv_pages = kv_cache.reshape(num_slots * num_blocks, *kv_cache.shape[2:])
        placement = kv_placement or tuple((0, index) for index in range(num_layers))
        x = embedding_rows(self.embed[...], token_ids)
        if cfg.embed_scale is not None:
            x = x * jnp.asarray(cfg.embed_scale, x.dtype)  # rounded to the activation dtype first, as HF does
        global_tables, local_tables = self._rope_tables(positions)
        alternating = bool(cfg.layer_is_sliding) and cfg.sliding_window is not None
        lora, lora_rows = None, None
        if self.lora is not None and lora_slots is not None:
            lora, lora_rows = self.lora, row_slot_one_hot(lora_slots, self.lora.num_slots(), x.dtype)
        step = _StepContext(cfg, metadata, attend, num_rows=metadata.cu_q_lens[-1], num_blocks=num_blocks,
                            global_tables=global_tables, local_tables=local_tables, alternating=alternating,
                            feed_forward=self.feed_forward, int8_matmul=self.int8_matmul,
                            group_tables=group_tables if kv_placement is not None else None, lora_rows=lora_rows)
        if self.layers.per_layer:
            carry = (x, kv_pages)
            for index in range(num_layers):
                sliding = not alternating or bool(cfg.layer_is_sliding[index])  # every layer slides if any does
                group, slot = placement[index]
                weights = self.layers.layer(index) if lora is None else {**self.layers.layer(index),
                                                                          **lora.layer(index)}
                carry = _decoder_layer(step, carry, weights, jnp.int32(slot), sliding,
                                       group if step.group_tables is not None else None)
            x, kv_pages = carry
        else:
            def scanned_layer(carry, scanned):
                stacked_slice, layer_slot, layer_is_sliding, *layer_group = scanned  # a group only when grouped
                return _decoder_layer(step, carry, DecoderLayers.one_layer(stacked_slice), layer_slot,
                                      layer_is_sliding, layer_group[0] if layer_group else None), None

            layer_slots = jnp.asarray([slot for _, slot in placement], dtype=jnp.int32)
            is_sliding = jnp.asarray(cfg.layer_is_sliding if alternating else (False,) * num_layers)
            stacked = self.layers.stacked() if lora is None else {**self.layers.stacked(), **lora.stacked()}
            scanned = (stacked, layer_slots, is_sliding)
            if step.group_tables is not None:
                scanned += (jnp.asarray([group for group, _ in placement], dtype=jnp.int32),)
            (x, kv_pages), _ = jax.lax.scan(scanned_layer, (x, kv_pages), scanned)
        return x, kv_pages.reshape(kv_cache.shape)

    def feed_forward(self, h: Float[Array, "num_tokens hidden"], w: dict[str, Any], proj: Callable,
                     num_rows: Int[Array, ""]) -> Float[Array, "num_tokens hidden"]:
        """One layer's MLP on its normed input `h`, from the layer's weights `w` (`proj(name)` gives a projection
        as matmul takes it): the gated MLP. A family with its own block (a mixture of experts) overrides this."""
        del w  # the gated MLP's weights are all projections
        return gated_mlp(h, proj("gate_proj"), proj("up_proj"), proj("down_proj"), self.cfg.hidden_activation,
                         num_rows)

    def _rope_tables(self, positions: Int[Array, " num_tokens"]) -> tuple[RopeTables, RopeTables]:
        """(global, local) RoPE tables of the step's positions: Gemma 3's local layers rotate with another base;
        elsewhere both are the same tables."""
        cfg = self.cfg
        global_freq = rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling) / cfg.rope_linear_factor
        materialize = self.layers.per_layer
        global_tables = rope_tables(positions, global_freq, materialize=materialize, scale=cfg.rope_attention_scale)
        local_tables = global_tables if cfg.local_rope_theta is None else rope_tables(
            positions, rope_inverse_frequencies(cfg.head_dim, cfg.local_rope_theta, None), materialize=materialize)
        return global_tables, local_tables

    def logits(self, x: Float[Array, "rows hidden"], num_rows: Optional[Int[Array, ""]] = None,
               ) -> Float[Array, "rows vocab"]:
        """Final norm and vocabulary projection of some rows' hidden states, in float32 (soft-capped if the model
        caps them). `num_rows`: rows from it on are padding (the native CPU matmul leaves their logits zero)."""
        cfg = self.cfg
        h = rms_norm(x, self.final_norm[...], cfg.rms_norm_eps, cfg.norm_offset)
        # An untied lm_head, or a tied table stored as the panels of its transpose (packed_weights.py), is a
        # matmul weight as it is.
        head = self.lm_head[...] if self.lm_head is not None else self.embed[...]
        if self.lm_head is not None or head.ndim == 3:
            logits = matmul(h, head, out_dtype=jnp.float32, num_rows=num_rows)
        else:
            # Contract with the tied embedding's rows directly: `h @ embed.T` makes XLA:CPU transpose the whole
            # bfloat16 table every step (57 ms against 13 ms at 64 rows, SmolLM2's 49152 x 576).
            logits = jnp.einsum("rh,vh->rv", h, head, preferred_element_type=jnp.float32)
        if cfg.final_soft_cap is not None:
            logits = cfg.final_soft_cap * jnp.tanh(logits / cfg.final_soft_cap)
        return logits


@dataclasses.dataclass(frozen=True)
class _StepContext:
    """What every decoder layer of one step reads besides its weights and the carried activations and pages."""

    cfg: ModelConfig
    metadata: AttentionMetadata
    attend: Callable
    num_rows: Any
    """The step's real token count (a traced int32): rows after it are padding."""
    num_blocks: int
    """Blocks per layer in the stacked pages: layer i's pages start at i * num_blocks."""
    global_tables: Any
    local_tables: Any
    alternating: bool
    """Layers alternate sliding-window and full attention (Gemma 2 / 3)."""
    feed_forward: Callable
    """The model's MLP block (LlamaForCausalLM.feed_forward)."""
    int8_matmul: Optional[str] = None
    """How the int8 projections multiply (LlamaForCausalLM's `int8_matmul`)."""
    group_tables: Any = None
    """KV layer groups: each group's block tables and slots (runner/batch.py GroupTables); None with one group."""
    lora_rows: Any = None
    """The one-hot [num_tokens, slots] of each row's LoRA slot, when the model has adapter slots."""

    def layer_metadata(self, layer_group) -> AttentionMetadata:
        """The attention metadata of a layer of KV layer group `layer_group` (an int, or traced under the scan)."""
        tables = self.group_tables
        if tables is None or layer_group is None:
            return self.metadata
        return dataclasses.replace(self.metadata, block_tables=tables.block_tables[layer_group],
                                   slot_mapping=tables.slot_mapping[layer_group])


def _decoder_layer(step: _StepContext, carry, w: dict[str, Any], layer_index, layer_is_sliding, layer_group=None):
    """One decoder layer: attention (K/V written into the layer's pages) and the MLP, each behind its norm(s).
    `layer_is_sliding` is a bool when the layers are unrolled (no cond to compile), traced under the scan.
    `layer_index` is the layer's slot in the pool (its index, with one KV layer group), `layer_group` its group."""
    cfg, num_rows = step.cfg, step.num_rows
    eps, offset = cfg.rms_norm_eps, cfg.norm_offset
    x, kv_pages = carry
    num_tokens = x.shape[0]

    def proj(name: str) -> Union[jax.Array, Int8Weight, W8A16Weight, W8A8Weight, VnniW8A8Weight, VnniW8A16Weight,
                                 Int8Bf16Weight, LoRAProjection]:
        return _projection(w, name, step.int8_matmul, step.lora_rows)

    h = rms_norm(x, w["input_norm"], eps, offset)
    q, k, v = matmuls(h, (proj("q_proj"), proj("k_proj"), proj("v_proj")), num_rows=num_rows)
    if cfg.qkv_bias:
        q, k, v = q + w["q_bias"], k + w["k_bias"], v + w["v_bias"]
    q = q.reshape(num_tokens, cfg.num_q_heads, cfg.head_dim)
    k = k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
    v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, w["q_norm"], eps, offset)
        k = rms_norm(k, w["k_norm"], eps, offset)
    global_tables, local_tables = step.global_tables, step.local_tables
    if isinstance(layer_is_sliding, bool):  # unrolled: the layer's kind is known, no cond to compile
        window, traced_is_sliding = (cfg.sliding_window if layer_is_sliding else None), None
        tables = local_tables if layer_is_sliding and step.alternating else global_tables
    else:
        window, traced_is_sliding = cfg.sliding_window, (layer_is_sliding if step.alternating else None)
        tables = global_tables if local_tables is global_tables else jax.tree.map(
            lambda local, global_: jnp.where(layer_is_sliding, local, global_), local_tables, global_tables)
    q = apply_rope(q, tables)
    k = apply_rope(k, tables)
    # gpt-oss: a learned sink logit per query head joins each softmax's denominator.
    sinks = {} if "sinks" not in w else {"sinks": w["sinks"].astype(jnp.float32)}
    attn, kv_pages = step.attend(q, k, v, kv_pages, layer_index * step.num_blocks, step.layer_metadata(layer_group),
                                 traced_is_sliding, sliding_window=window, sm_scale=cfg.attn_scale,
                                 soft_cap=cfg.attn_soft_cap, **sinks)
    attn = matmul(attn.reshape(num_tokens, -1), proj("o_proj"), num_rows=num_rows)
    if "o_bias" in w:  # gpt-oss biases the output projection too
        attn = attn + w["o_bias"]
    if cfg.sandwich_norms:
        attn = rms_norm(attn, w["attn_out_norm"], eps, offset)
    x = x + attn
    h = rms_norm(x, w["post_norm"], eps, offset)
    mlp = step.feed_forward(h, w, proj, num_rows)
    if cfg.sandwich_norms:
        mlp = rms_norm(mlp, w["mlp_out_norm"], eps, offset)
    return x + mlp, kv_pages


def _projection(w: dict[str, Any], name: str, int8_matmul: Optional[str] = None, lora_rows: Any = None,
                ) -> Union[jax.Array, Int8Weight, W8A16Weight, W8A8Weight, VnniW8A8Weight, VnniW8A16Weight,
                           Int8Bf16Weight, LoRAProjection]:
    """One layer's projection as matmul takes it: the float (or packed) weight, or int8 values with their scales in
    the form `int8_matmul` names; with the step's LoRA slots of it beside (`lora_rows`: each row's slot, one-hot)
    when the layer has them."""
    base = _base_projection(w, name, int8_matmul)
    if lora_rows is None or lora_a_name(name) not in w:
        return base
    return LoRAProjection(base, w[lora_a_name(name)], w[lora_b_name(name)], lora_rows)


def _base_projection(w: dict[str, Any], name: str, int8_matmul: Optional[str],
                     ) -> Union[jax.Array, Int8Weight, W8A16Weight, W8A8Weight, VnniW8A8Weight, VnniW8A16Weight,
                                Int8Bf16Weight]:
    scale = w.get(scale_name(name))
    if scale is None:
        return w[name]
    if int8_matmul == "w8a8" or (int8_matmul == "vnni w8a8" and w[name].ndim == 2):  # a weight that did not pack
        return W8A8Weight(w[name], scale)
    if int8_matmul == "vnni w8a8":
        return VnniW8A8Weight(w[name], scale)
    if int8_matmul == "int16 digits" or (int8_matmul == "vnni digits" and w[name].ndim == 2):
        return W8A16Weight(w[name], scale)
    if int8_matmul == "vnni digits":
        return VnniW8A16Weight(w[name], scale)
    if int8_matmul == "bf16 panels" and w[name].ndim == 3:
        return Int8Bf16Weight(w[name], scale)
    return Int8Weight(w[name], scale)
