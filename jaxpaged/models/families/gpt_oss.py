"""gpt-oss (GptOssForCausalLM), as transformers' models/gpt_oss defines it: layers alternating sliding-window and
full attention, q/k/v/o biases, a learned attention sink per query head, YaRN RoPE, and a mixture of experts
(models/moe_decoder.py) routed top-k then softmax over biased router logits, whose experts have biases and a clamped
SwiGLU.

Checkpoints keep the experts fused per layer: `mlp.experts.gate_up_proj` [E, hidden, 2 * intermediate] with gate
and up columns interleaved (even gate, odd up) and `down_proj` [E, intermediate, hidden], biases beside them;
OpenAI's released files store both weights in MXFP4 (`_blocks` / `_scales`), which the loader dequantizes to the
same tensors (weights/mxfp4.py).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxpaged.models.expert_tensors import Fused, expert_stack
from jaxpaged.models.families.llama import HF_NAMES as LLAMA_HF_NAMES
from jaxpaged.models.model_config import decoder_fields
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.moe import Activation
from jaxpaged.models.moe_decoder import MoeForCausalLM, MoeModelConfig
from jaxpaged.models.weight_names import AssembledTensor, CheckpointTensor


@dataclasses.dataclass(frozen=True)
class GptOssConfig(MoeModelConfig):
    """gpt-oss's decoder: a MoeModelConfig with its SwiGLU constants, o_proj bias and attention sinks."""

    swiglu_alpha: float = 1.702
    """The gate's sigmoid slope: gate * sigmoid(alpha * gate)."""
    swiglu_limit: float = 7.0
    """The gate is clamped from above at limit, up to [-limit, limit]."""

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """The MoE decoder's shapes plus the output projection's bias and one attention sink per query head."""
        return super().layer_shapes() | {"o_bias": (self.hidden_size,), "sinks": (self.num_q_heads,)}


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
        moe_intermediate_size=int(raw["intermediate_size"]), routing_style="topk_softmax", router_bias=True,
        expert_biases=True, swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(raw.get("swiglu_limit", 7.0)))


def clamped_swiglu(gate: Float[Array, "rows inner"], up: Float[Array, "rows inner"], *, alpha: float,
                   limit: float) -> Float[Array, "rows inner"]:
    """gpt-oss's expert activation: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""
    gate = jnp.minimum(gate, limit)
    return (jnp.clip(up, -limit, limit) + 1) * gate * jax.nn.sigmoid(alpha * gate)


class GptOssForCausalLM(MoeForCausalLM):
    """The MoE decoder with gpt-oss's clamped SwiGLU (the sinks and o_proj bias are the shared decoder's)."""

    def expert_activation(self) -> Activation:
        """clamped_swiglu with the config's alpha and limit."""
        cfg = self.cfg
        assert isinstance(cfg, GptOssConfig)
        return functools.partial(clamped_swiglu, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit)


_T = CheckpointTensor
_EXPERTS = "mlp.experts."


def _gate_up(param: str, name: str, part: int) -> AssembledTensor:
    # gate_up_proj [E, hidden, 2I] and its bias [E, 2I] alternate gate (even) and up (odd) columns.
    return expert_stack(param, Fused(_EXPERTS + name, part=part, parts=2, transposed=False, interleaved=True))


HF_NAMES = LLAMA_HF_NAMES.with_layer(
    o_bias=_T("self_attn.o_proj.bias"), sinks=_T("self_attn.sinks"),
    router=_T("mlp.router.weight", True), router_bias=_T("mlp.router.bias"),
    expert_gate=_gate_up("expert_gate", "gate_up_proj", 0), expert_up=_gate_up("expert_up", "gate_up_proj", 1),
    expert_down=expert_stack("expert_down", Fused(_EXPERTS + "down_proj", transposed=False)),
    expert_gate_bias=_gate_up("expert_gate_bias", "gate_up_proj_bias", 0),
    expert_up_bias=_gate_up("expert_up_bias", "gate_up_proj_bias", 1),
    expert_down_bias=expert_stack("expert_down_bias", Fused(_EXPERTS + "down_proj_bias", transposed=False)),
)
"""transformers' GptOssForCausalLM names (fused experts, in bfloat16 or MXFP4)."""

ENTRIES = (
    ModelEntry("GptOssForCausalLM", read_gpt_oss_config, HF_NAMES, model_class=GptOssForCausalLM,
               model_type="gpt_oss"),
)
"""This family's registry entries."""
