"""Mixtral (MixtralForCausalLM), as transformers' models/mixtral defines it: Mistral's attention (a sliding window
whenever the config sets one) with a mixture of SiLU-gated experts (models/moe_decoder.py) in every layer, routed by
softmax, top-k and renormalisation of the kept weights, with no biases.

Checkpoints name the experts one tensor per expert, `block_sparse_moe.experts.N.w1/w2/w3.weight` (w1 the gate, w3 the
up projection, w2 the down one) beside the router `block_sparse_moe.gate.weight`: the hub's files, and what
transformers 5's save_pretrained writes. transformers 5's in-memory layout loads too: fused
`mlp.experts.gate_up_proj` [E, 2 * intermediate, hidden] (gate half first), `mlp.experts.down_proj`
[E, hidden, intermediate] and the router at `mlp.gate.weight`.
"""

from jaxpaged.models.expert_tensors import Fused, PerExpert, expert_stack, first_of
from jaxpaged.models.families.llama import HF_NAMES as LLAMA_HF_NAMES
from jaxpaged.models.families.llama import read_llama_config
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.moe_decoder import MoeForCausalLM, MoeModelConfig, moe_fields

_PER_EXPERT = "block_sparse_moe.experts.{expert}."

HF_NAMES = LLAMA_HF_NAMES.with_layer(
    router=first_of("block_sparse_moe.gate.weight", "mlp.gate.weight"),
    expert_gate=expert_stack("expert_gate", PerExpert(_PER_EXPERT + "w1.weight"),
                             Fused("mlp.experts.gate_up_proj", part=0, parts=2)),
    expert_up=expert_stack("expert_up", PerExpert(_PER_EXPERT + "w3.weight"),
                           Fused("mlp.experts.gate_up_proj", part=1, parts=2)),
    expert_down=expert_stack("expert_down", PerExpert(_PER_EXPERT + "w2.weight"), Fused("mlp.experts.down_proj")),
)
"""transformers' MixtralForCausalLM names: per-expert tensors, or transformers 5's fused ones."""


def read_mixtral_config(raw: dict, architecture: str) -> MoeModelConfig:
    """A Mixtral MoeModelConfig from an HF config dict; ValueError naming hidden_act unless SiLU."""
    base = read_llama_config(raw, architecture, always_windowed=True)
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"hidden_act: {activation!r} is not supported for {architecture} (only silu)")
    return MoeModelConfig(
        **moe_fields(base), num_experts=int(raw["num_local_experts"]),
        num_experts_per_tok=int(raw["num_experts_per_tok"]), moe_intermediate_size=base.intermediate_size,
        routing_style="softmax_topk", norm_topk_prob=True)


ENTRIES = (
    ModelEntry("MixtralForCausalLM", read_mixtral_config, HF_NAMES, model_class=MoeForCausalLM,
               model_type="mixtral"),
)
"""This family's registry entries."""
