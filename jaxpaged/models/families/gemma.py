"""Gemma 2 and Gemma 3 (text), run by the shared decoder (models/llama.py) with ModelConfig's variant fields set as
transformers' Gemma2 / Gemma3 text models define them: GELU-tanh gated MLP, (1 + w) RMSNorms, sandwich norms
around attention and MLP, embeddings scaled by sqrt(hidden), attention and final logit soft-capping, alternating
sliding-window / global layers, and (Gemma 3) q/k norms, local RoPE base and linear RoPE scaling of the global layers.
"""

import functools

from jaxpaged.models.families.llama import HF_NAMES as LLAMA_HF_NAMES
from jaxpaged.models.model_config import ModelConfig, decoder_fields, global_rope_parameters
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.weight_names import CheckpointTensor

HF_NAMES = LLAMA_HF_NAMES.with_layer(
    # Four norms per layer: HF's post_attention_layernorm normalises the attention output, and its
    # pre_feedforward_layernorm is the pre-MLP norm the Llama family calls post_attention_layernorm.
    post_norm=CheckpointTensor("pre_feedforward_layernorm.weight"),
    attn_out_norm=CheckpointTensor("post_attention_layernorm.weight"),
    mlp_out_norm=CheckpointTensor("post_feedforward_layernorm.weight"),
)
"""transformers' Gemma2ForCausalLM / Gemma3ForCausalLM names."""

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


def read_gemma_config(raw: dict, architecture: str, *, qk_norm: bool) -> ModelConfig:
    """A Gemma 2 / 3 ModelConfig from an HF config dict; ValueError naming hidden_activation unless GELU-tanh."""
    fields = decoder_fields(raw, architecture)
    head_dim, num_layers = fields["head_dim"], fields["num_layers"]
    layer_types = raw.get("layer_types")
    if not layer_types:  # older configs: Gemma 2 alternates from layer 0; Gemma 3 has one global layer per pattern
        pattern = raw.get("sliding_window_pattern") or 2
        layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    rope = raw.get("rope_parameters") or {}
    local_rope = rope.get("sliding_attention", {})
    global_rope = global_rope_parameters(raw)
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in _GELU_TANH:
        raise ValueError(f"hidden_activation: {activation!r} is not supported for Gemma (only gelu_pytorch_tanh)")
    return ModelConfig(
        **fields, qkv_bias=bool(raw.get("attention_bias", False)), qk_norm=qk_norm,
        sliding_window=raw.get("sliding_window"),
        layer_is_sliding=tuple(kind == "sliding_attention" for kind in layer_types),
        local_rope_theta=local_rope.get("rope_theta") or raw.get("rope_local_base_freq"),
        rope_linear_factor=float(global_rope.get("factor", 1.0)) if global_rope.get("rope_type") == "linear" else 1.0,
        norm_offset=1.0, sandwich_norms=True, hidden_activation="gelu_tanh",
        embed_scale=float(raw["hidden_size"]) ** 0.5,
        attn_scale=float(raw.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        attn_soft_cap=raw.get("attn_logit_softcapping"), final_soft_cap=raw.get("final_logit_softcapping"))


ENTRIES = (
    ModelEntry("Gemma2ForCausalLM", functools.partial(read_gemma_config, qk_norm=False), HF_NAMES,
               model_type="gemma2"),
    ModelEntry("Gemma3ForCausalLM", functools.partial(read_gemma_config, qk_norm=True), HF_NAMES,
               model_type="gemma3_text"),
)
"""This family's registry entries."""
