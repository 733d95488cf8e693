"""The Llama family: Llama (llama3 RoPE scaling included), Mistral, Qwen2 (qkv bias) and Qwen3 (q/k norm), all run
by the decoder in models/llama.py with its defaults; HF safetensors and GGUF names."""

import functools

from jaxpaged.models.model_config import ModelConfig, decoder_fields
from jaxpaged.models.model_entry import GgufFormat, ModelEntry
from jaxpaged.models.weight_names import CheckpointTensor, WeightNames

_T = CheckpointTensor

HF_NAMES = WeightNames(
    layer={
        "input_norm": _T("input_layernorm.weight"),
        "q_proj": _T("self_attn.q_proj.weight", True), "k_proj": _T("self_attn.k_proj.weight", True),
        "v_proj": _T("self_attn.v_proj.weight", True), "o_proj": _T("self_attn.o_proj.weight", True),
        "q_bias": _T("self_attn.q_proj.bias"), "k_bias": _T("self_attn.k_proj.bias"),
        "v_bias": _T("self_attn.v_proj.bias"),
        "q_norm": _T("self_attn.q_norm.weight"), "k_norm": _T("self_attn.k_norm.weight"),
        "post_norm": _T("post_attention_layernorm.weight"),
        "gate_proj": _T("mlp.gate_proj.weight", True), "up_proj": _T("mlp.up_proj.weight", True),
        "down_proj": _T("mlp.down_proj.weight", True),
    },
    globals={"embed": _T("model.embed_tokens.weight"), "final_norm": _T("model.norm.weight"),
             "lm_head": _T("lm_head.weight", True)},
)
"""transformers' names (model.layers.N.self_attn.q_proj.weight ...); other families start from these."""

GGUF_NAMES = WeightNames(
    layer={
        "input_norm": _T("attn_norm.weight"),
        "q_proj": _T("attn_q.weight", True), "k_proj": _T("attn_k.weight", True),
        "v_proj": _T("attn_v.weight", True), "o_proj": _T("attn_output.weight", True),
        "q_bias": _T("attn_q.bias"), "k_bias": _T("attn_k.bias"), "v_bias": _T("attn_v.bias"),
        "q_norm": _T("attn_q_norm.weight"), "k_norm": _T("attn_k_norm.weight"),
        "post_norm": _T("ffn_norm.weight"),
        "gate_proj": _T("ffn_gate.weight", True), "up_proj": _T("ffn_up.weight", True),
        "down_proj": _T("ffn_down.weight", True),
    },
    globals={"embed": _T("token_embd.weight"), "final_norm": _T("output_norm.weight"),
             "lm_head": _T("output.weight", True)},
    layer_prefix="blk.{layer}.",
)
"""llama.cpp's names (blk.N.attn_q.weight ...); a [out, in] matrix is stored as rows of `in` values."""


def read_llama_config(raw: dict, architecture: str, *, qkv_bias: bool = False, qk_norm: bool = False,
                      always_windowed: bool = False) -> ModelConfig:
    """A Llama-family ModelConfig from an HF config dict. `qkv_bias`: the family always biases q, k and v (Qwen2;
    others may say attention_bias); `qk_norm`: it normalises q and k per head (Qwen3); `always_windowed`: its
    sliding_window applies whenever set (Mistral), where Qwen's configs carry one that only use_sliding_window
    enables."""
    window = raw.get("sliding_window") if always_windowed or raw.get("use_sliding_window", False) else None
    return ModelConfig(**decoder_fields(raw, architecture),
                       qkv_bias=qkv_bias or bool(raw.get("attention_bias", False)), qk_norm=qk_norm,
                       sliding_window=window)


ENTRIES = (
    ModelEntry("LlamaForCausalLM", read_llama_config, HF_NAMES, model_type="llama",
               gguf=GgufFormat("llama", GGUF_NAMES, unpermutes_rope=True)),
    ModelEntry("MistralForCausalLM", functools.partial(read_llama_config, always_windowed=True), HF_NAMES,
               model_type="mistral", gguf=GgufFormat("mistral", GGUF_NAMES, unpermutes_rope=True)),
    ModelEntry("Qwen2ForCausalLM", functools.partial(read_llama_config, qkv_bias=True), HF_NAMES,
               model_type="qwen2", gguf=GgufFormat("qwen2", GGUF_NAMES)),
    ModelEntry("Qwen3ForCausalLM", functools.partial(read_llama_config, qk_norm=True), HF_NAMES,
               model_type="qwen3", gguf=GgufFormat("qwen3", GGUF_NAMES)),
)
"""This family's registry entries."""
