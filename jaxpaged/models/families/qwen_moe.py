"""The Qwen mixture-of-experts family. Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B, Qwen3-235B-A22B,
Qwen3-Coder-480B-A35B): Qwen3's attention (q/k norms) with a mixture-of-experts MLP (models/moe_decoder.py): softmax
over the experts, top num_experts_per_tok, renormalised when norm_topk_prob; dense gated MLPs on the layers that
mlp_only_layers and decoder_sparse_step leave without experts. Experts load from per-expert tensors (what the hub
checkpoints and transformers 5's save_pretrained write) or the fused 3-D ones (models/expert_tensors.py).
Qwen2-MoE (Qwen2MoeForCausalLM: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B) is the same block on Qwen2's attention (qkv
bias, no q/k norm) plus a shared expert: a gated MLP every token runs, scaled by sigmoid(x @ shared_expert_gate).
"""

import functools

from jaxpaged.models.expert_tensors import Fused, PerExpert, expert_stack, layer_flag, on_layers_of_kind
from jaxpaged.models.families.llama import HF_NAMES as LLAMA_HF_NAMES
from jaxpaged.models.families.llama import read_llama_config
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.moe_decoder import MoeForCausalLM, MoeModelConfig, moe_fields

HF_NAMES = LLAMA_HF_NAMES.with_layer(
    router=on_layers_of_kind("router", "mlp.gate.weight", with_experts=True),
    expert_gate=expert_stack("expert_gate", PerExpert("mlp.experts.{expert}.gate_proj.weight"),
                             Fused("mlp.experts.gate_up_proj", part=0, parts=2)),
    expert_up=expert_stack("expert_up", PerExpert("mlp.experts.{expert}.up_proj.weight"),
                           Fused("mlp.experts.gate_up_proj", part=1, parts=2)),
    expert_down=expert_stack("expert_down", PerExpert("mlp.experts.{expert}.down_proj.weight"),
                             Fused("mlp.experts.down_proj")),
    # Read only when dense and MoE layers mix (MoeModelConfig.layer_shapes): zeros on the other kind's layers.
    gate_proj=on_layers_of_kind("gate_proj", "mlp.gate_proj.weight", with_experts=False),
    up_proj=on_layers_of_kind("up_proj", "mlp.up_proj.weight", with_experts=False),
    down_proj=on_layers_of_kind("down_proj", "mlp.down_proj.weight", with_experts=False),
    expert_layer=layer_flag(),
)
"""transformers' Qwen3MoeForCausalLM names (model.layers.N.mlp.experts.M.gate_proj.weight, mlp.gate.weight ...)."""

QWEN2_MOE_HF_NAMES = HF_NAMES.with_layer(
    shared_gate=on_layers_of_kind("shared_gate", "mlp.shared_expert.gate_proj.weight", with_experts=True),
    shared_up=on_layers_of_kind("shared_up", "mlp.shared_expert.up_proj.weight", with_experts=True),
    shared_down=on_layers_of_kind("shared_down", "mlp.shared_expert.down_proj.weight", with_experts=True),
    shared_expert_gate=on_layers_of_kind("shared_expert_gate", "mlp.shared_expert_gate.weight", with_experts=True),
)
"""Qwen2MoeForCausalLM's: Qwen3-MoE's plus the shared expert's (mlp.shared_expert.*, mlp.shared_expert_gate)."""


def read_qwen_moe_config(raw: dict, architecture: str, *, qwen2: bool = False) -> MoeModelConfig:
    """A Qwen3-MoE (or, `qwen2`, Qwen2-MoE: qkv bias, no q/k norm, a shared expert) MoeModelConfig from an HF config
    dict; ValueError naming hidden_act unless SiLU."""
    if qwen2:
        base = read_llama_config(raw, architecture, qkv_bias=bool(raw.get("qkv_bias", True)))
    else:
        base = read_llama_config(raw, architecture, qk_norm=True)
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"hidden_act: {activation!r} is not supported for {architecture} (only silu)")
    # transformers 5 writes num_experts as num_local_experts (its attribute_map); older configs say num_experts.
    num_experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    mlp_only = set(raw.get("mlp_only_layers") or ())
    step = int(raw.get("decoder_sparse_step") or 1)
    expert_layers = tuple(layer not in mlp_only and num_experts > 0 and (layer + 1) % step == 0
                          for layer in range(base.num_layers))
    return MoeModelConfig(
        **moe_fields(base), num_experts=num_experts, num_experts_per_tok=int(raw.get("num_experts_per_tok") or 1),
        moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        expert_layers=() if all(expert_layers) else expert_layers,
        shared_expert_size=int(raw.get("shared_expert_intermediate_size") or 0) if qwen2 else 0)


ENTRIES = (
    ModelEntry("Qwen3MoeForCausalLM", read_qwen_moe_config, HF_NAMES, model_class=MoeForCausalLM,
               model_type="qwen3_moe"),
    ModelEntry("Qwen2MoeForCausalLM", functools.partial(read_qwen_moe_config, qwen2=True), QWEN2_MOE_HF_NAMES,
               model_class=MoeForCausalLM, model_type="qwen2_moe"),
)
"""This family's registry entries."""
