"""gpt-oss (GptOssForCausalLM), as transformers' models/gpt_oss defines it: layers alternating sliding-window and
full attention, q/k/v/o biases, a learned attention sink per query head, YaRN RoPE, and a mixture of experts routed
top-k then softmax (router bias), whose experts have biases and a clamped SwiGLU.

Checkpoints keep the experts fused per layer: `mlp.experts.gate_up_proj` [E, hidden, 2 * intermediate] with gate
and up columns interleaved (even gate, odd up), reordered at load to the gate half first, and `down_proj`
[E, intermediate, hidden]; OpenAI's released files store both in MXFP4 (`_blocks` / `_scales`, weights/mxfp4.py).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxpaged.models.expert_layouts import FusedExpertTensor
from jaxpaged.models.families import moe_stopgap
from jaxpaged.models.families.llama import HF_NAMES as LLAMA_HF_NAMES
from jaxpaged.models.layers import matmul
from jaxpaged.models.llama import LlamaForCausalLM
from jaxpaged.models.model_config import ModelConfig, decoder_fields
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.weight_names import CheckpointTensor, WeightNames

_T = CheckpointTensor
_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class GptOssConfig(ModelConfig):
    """gpt-oss's decoder: ModelConfig (intermediate_size is each expert's width) plus its experts and SwiGLU."""

    num_experts: int = 0
    num_experts_per_tok: int = 0
    swiglu_alpha: float = 1.702
    """The gate's sigmoid slope: gate * sigmoid(alpha * gate)."""
    swiglu_limit: float = 7.0
    """The gate is clamped from above at limit, up to [-limit, limit]."""

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Attention with q/k/v/o biases and sinks, the router and its bias, and the experts with their biases."""
        shapes = {name: shape for name, shape in super().layer_shapes().items() if name not in _DENSE_MLP}
        hidden, experts, inter = self.hidden_size, self.num_experts, self.intermediate_size
        return shapes | {
            "o_bias": (hidden,), "sinks": (self.num_q_heads,),
            "router": (hidden, experts), "router_bias": (experts,),
            "experts_gate_up": (experts, hidden, 2 * inter), "experts_gate_up_bias": (experts, 2 * inter),
            "experts_down": (experts, inter, hidden), "experts_down_bias": (experts, hidden),
        }


def read_gpt_oss_config(raw: dict, architecture: str) -> GptOssConfig:
    """A GptOssConfig from an HF config dict (layer_types default: sliding first, then alternating)."""
    fields = decoder_fields(raw, architecture)
    layer_types = raw.get("layer_types") or [
        "sliding_attention" if index % 2 == 0 else "full_attention" for index in range(fields["num_layers"])]
    if len(layer_types) != fields["num_layers"]:
        raise ValueError(f"layer_types: {len(layer_types)} entries for {fields['num_layers']} layers")
    return GptOssConfig(
        **fields, qkv_bias=bool(raw.get("attention_bias", True)),
        sliding_window=raw.get("sliding_window") or 128,  # transformers' GptOssConfig default
        layer_is_sliding=tuple(kind == "sliding_attention" for kind in layer_types),
        num_experts=int(raw["num_local_experts"]),
        # OpenAI's config.json says experts_per_token beside (or, in early files, instead of) num_experts_per_tok.
        num_experts_per_tok=int(raw.get("num_experts_per_tok") or raw["experts_per_token"]),
        swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)), swiglu_limit=float(raw.get("swiglu_limit", 7.0)))


def clamped_swiglu(h: Float[Array, "rows two_inter"], alpha: float, limit: float) -> Float[Array, "rows inter"]:
    """gpt-oss's activation of fused [gate | up] columns: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g),
    g = min(gate, limit)."""
    gate, up = jnp.split(h, 2, axis=-1)
    gate = jnp.minimum(gate, limit)
    up = jnp.clip(up, -limit, limit)
    return (up + 1) * gate * jax.nn.sigmoid(alpha * gate)


class GptOssForCausalLM(LlamaForCausalLM):
    """The shared decoder with gpt-oss's mixture-of-experts block."""

    cfg: GptOssConfig

    def feed_forward(self, h: Float[Array, "num_tokens hidden"], w: dict[str, Any], proj: Callable,
                     num_rows: Int[Array, ""]) -> Float[Array, "num_tokens hidden"]:
        """Route each token to its top experts (top-k of the biased router logits, then softmax) and sum their
        biased clamped-SwiGLU outputs by weight."""
        cfg = self.cfg
        logits = matmul(h, proj("router"), out_dtype=jnp.float32, num_rows=num_rows) + w["router_bias"].astype(
            jnp.float32)
        ids, weights = moe_stopgap.route(logits, cfg.num_experts_per_tok, "topk_softmax")

        def activation(x):
            return clamped_swiglu(x, cfg.swiglu_alpha, cfg.swiglu_limit)

        return moe_stopgap.moe_mlp(h, ids, weights, w["experts_gate_up"], w["experts_down"], activation, num_rows,
                                   w["experts_gate_up_bias"], w["experts_down_bias"])


HF_NAMES = WeightNames(
    layer={**{name: tensor for name, tensor in LLAMA_HF_NAMES.layer.items() if name not in _DENSE_MLP},
           "o_bias": _T("self_attn.o_proj.bias"), "sinks": _T("self_attn.sinks"),
           "router": _T("mlp.router.weight", True), "router_bias": _T("mlp.router.bias"),
           "experts_gate_up": FusedExpertTensor("mlp.experts.gate_up_proj", interleaved=True, mxfp4=True),
           "experts_gate_up_bias": FusedExpertTensor("mlp.experts.gate_up_proj_bias", interleaved=True),
           "experts_down": FusedExpertTensor("mlp.experts.down_proj", mxfp4=True),
           "experts_down_bias": FusedExpertTensor("mlp.experts.down_proj_bias")},
    globals=LLAMA_HF_NAMES.globals,
)
"""transformers' GptOssForCausalLM names (fused experts, bfloat16 or MXFP4)."""

ENTRIES = (
    ModelEntry("GptOssForCausalLM", read_gpt_oss_config, HF_NAMES, model_class=GptOssForCausalLM,
               model_type="gpt_oss"),
)
"""This family's registry entries."""
