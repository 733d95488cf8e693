"""Tiny random-weight HF checkpoints of each supported family, written with save_pretrained."""

from typing import Any

import pytest
import torch
import transformers

TINY: dict[str, Any] = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                            rms_norm_eps=1e-5)

THREE_LAYERS: dict[str, Any] = TINY | {"num_hidden_layers": 3}

FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(
        **TINY, tie_word_embeddings=False,  # rope_parameters: transformers 5's name of the deprecated rope_scaling
        rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32, "rope_theta": 10000.0}),
    "mistral": lambda: transformers.MistralConfig(**TINY, tie_word_embeddings=False, sliding_window=None),
    "qwen2": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=True),
    "qwen3": lambda: transformers.Qwen3Config(**TINY, tie_word_embeddings=True),
    # Windows of 8 tokens, so the longer prompts outgrow them; caps small enough to bite on random weights.
    "gemma2": lambda: transformers.Gemma2Config(
        **TINY, tie_word_embeddings=True, sliding_window=8, query_pre_attn_scalar=12, attn_logit_softcapping=3.0,
        final_logit_softcapping=2.0),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **THREE_LAYERS, tie_word_embeddings=True, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=12,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}}),
}


def make_hf_checkpoint(family: str, directory) -> transformers.PreTrainedModel:
    """Build a seeded random model of `family`, save it to `directory` (bfloat16 safetensors), return it in float32
    eval mode with those bfloat16-rounded weights."""
    torch.manual_seed(0)
    config = FAMILIES[family]()
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # HF's init leaves biases at 0; random biases make the Qwen2 bias path observable
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
        # Saved in bfloat16, as hub checkpoints are; the reference runs in float32 on the same rounded weights,
        # which is what the engine loads (read as bfloat16, computed in float32). Only the parameters are rounded:
        # model.to(bfloat16) would also round buffers such as RoPE's inverse frequencies.
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).to(torch.float32))
    model.eval()
    model.save_pretrained(directory, state_dict={name: value.to(torch.bfloat16)
                                                 for name, value in model.state_dict().items()})
    return model


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def tiny_checkpoint(request, tmp_path_factory):
    """(family, HF torch model, checkpoint dir) for every supported family."""
    directory = tmp_path_factory.mktemp(f"hf-{request.param}")
    model = make_hf_checkpoint(request.param, directory)
    return request.param, model, directory
