"""Writes tiny GGUF files with the gguf package, as llama.cpp's converter lays them out: an HF checkpoint's tensors
under GGUF names (q and k rows in llama.cpp's rotary order), projections quantized by the gguf package itself, and
the embedded model's tokenizer metadata."""

import json
import pathlib
from typing import Optional

import gguf
import numpy as np

_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}


def _permute_for_llama_cpp(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """HF's rotate-half row order -> llama.cpp's interleaved pairs (what its HF converter does to q and k)."""
    return weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:]).swapaxes(
        1, 2).reshape(weight.shape)


def write_llama_gguf(target: pathlib.Path, hf_dir: pathlib.Path, tokenizer_gguf: Optional[pathlib.Path],
                     projection_type: gguf.GGMLQuantizationType) -> pathlib.Path:
    """`hf_dir`'s Llama (a float checkpoint) as a GGUF whose layer projections are `projection_type` (Q8_0, F32 ...)
    and whose other tensors are float32, with `tokenizer_gguf`'s tokenizer (None: none, weights only)."""
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    tensors = {name: value.astype(np.float32) for name, value in load_file(str(hf_dir / "model.safetensors")).items()}
    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_vocab_size(config["vocab_size"])
    for field in gguf.GGUFReader(str(tokenizer_gguf)).fields.values() if tokenizer_gguf is not None else ():
        if field.name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type)
    writer.add_tensor("token_embd.weight", tensors["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", tensors["model.norm.weight"])
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings", True):
        writer.add_tensor("output.weight", tensors["lm_head.weight"])
    for layer in range(config["num_hidden_layers"]):
        for hf_name, gguf_name in _LAYER.items():
            value = tensors[f"model.layers.{layer}.{hf_name}"]
            if hf_name == "self_attn.q_proj.weight":
                value = _permute_for_llama_cpp(value, config["num_attention_heads"])
            elif hf_name == "self_attn.k_proj.weight":
                value = _permute_for_llama_cpp(value, config["num_key_value_heads"])
            name = f"blk.{layer}.{gguf_name}"
            if value.ndim == 2 and projection_type != gguf.GGMLQuantizationType.F32:
                writer.add_tensor(name, gguf.quants.quantize(value, projection_type), raw_dtype=projection_type)
            else:
                writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
