"""Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B-A35B): Qwen3's attention (q/k
norms) with a mixture-of-experts MLP (models/moe_decoder.py): softmax over the experts, top num_experts_per_tok,
renormalised when norm_topk_prob; dense gated MLPs on the layers mlp_only_layers and decoder_sparse_step leave
without experts. Experts load from per-expert tensors (what the hub checkpoints and transformers 5's
save_pretrained write) or the fused 3-D ones (models/expert_tensors.py).
"""

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


def read_qwen3_moe_config(raw: dict, architecture: str) -> MoeModelConfig:
    """A Qwen3-MoE MoeModelConfig from an HF config dict; ValueError naming hidden_act unless SiLU."""
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
        expert_layers=() if all(expert_layers) else expert_layers)


ENTRIES = (
    ModelEntry("Qwen3MoeForCausalLM", read_qwen3_moe_config, HF_NAMES, model_class=MoeForCausalLM,
               model_type="qwen3_moe"),
)
"""This family's registry entries."""
