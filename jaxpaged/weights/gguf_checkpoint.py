"""Load a GGUF file (llama.cpp's format) with the gguf package: metadata -> HF-style config, tensors dequantized."""

import pathlib
import subprocess
import sys
from typing import Any, Optional

import gguf
import numpy as np

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.weights.param_names import stack_layers

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_LAYER_TENSORS = {
    "input_norm": "attn_norm.weight", "q_proj": "attn_q.weight", "k_proj": "attn_k.weight",
    "v_proj": "attn_v.weight", "o_proj": "attn_output.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias", "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "post_norm": "ffn_norm.weight", "gate_proj": "ffn_gate.weight", "up_proj": "ffn_up.weight",
    "down_proj": "ffn_down.weight",
}
_GLOBAL_TENSORS = {"embed": "token_embd.weight", "final_norm": "output_norm.weight", "lm_head": "output.weight"}
_PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.parts[field.data[0]]
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8")
    return value.item() if value.size == 1 else value.tolist()


def gguf_hf_config(reader: gguf.GGUFReader) -> dict:
    """The HF config.json equivalent of the file's metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {sorted(_ARCHITECTURES)}")
    names = {t.name for t in reader.tensors}
    num_heads = _field(reader, f"{arch}.attention.head_count")
    config = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": _field(reader, f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": _field(reader, f"{arch}.embedding_length"),
        "intermediate_size": _field(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _field(reader, f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": _field(reader, f"{arch}.attention.head_count_kv", num_heads),
        "rms_norm_eps": _field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": _field(reader, f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": _field(reader, f"{arch}.context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    key_length = _field(reader, f"{arch}.attention.key_length")
    if key_length:
        config["head_dim"] = key_length
    if "rope_freqs.weight" in names:
        raise ValueError("GGUF with rope_freqs (llama3 rope scaling) is not supported yet; use the HF checkpoint")
    return config


def _unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (it interleaves each head's rotary pairs) to HF's rotate-half order."""
    out_dim = weight.shape[0]
    half = out_dim // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def load_gguf_checkpoint(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Return (HF config dict, jaxpaged params as float32 numpy arrays, dequantized)."""
    reader = gguf.GGUFReader(str(path))
    hf_config = gguf_hf_config(reader)
    cfg = ModelConfig.from_hf(hf_config)
    tensors = {t.name: t for t in reader.tensors}
    permutes_rope = hf_config["model_type"] in ("llama", "mistral")

    def fetch(name: str, layer: Optional[int]) -> np.ndarray:
        file_name = f"blk.{layer}.{_LAYER_TENSORS[name]}" if layer is not None else _GLOBAL_TENSORS[name]
        if file_name not in tensors:
            raise ValueError(f"GGUF {path}: tensor {file_name!r} is missing")
        tensor = tensors[file_name]
        # GGUF stores a [out, in] matrix as rows of `in` elements, like torch's Linear.weight.
        value = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if permutes_rope and name == "q_proj":
            value = _unpermute_rope_rows(value, cfg.num_q_heads)
        elif permutes_rope and name == "k_proj":
            value = _unpermute_rope_rows(value, cfg.num_kv_heads)
        return value.T if name in _PROJECTIONS else value

    return hf_config, stack_layers(cfg, fetch)


def convert_gguf_tokenizer(path: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Write the GGUF's tokenizer as HF tokenizer files into out_dir.

    Runs once in a child process (jaxpaged.weights.gguf_tokenizer, torch-free), so transformers' converters and
    their vocabulary tables never stay in the engine process; the result is cached with the converted weights.
    """
    subprocess.run([sys.executable, "-m", "jaxpaged.weights.gguf_tokenizer", str(path), str(out_dir)],
                   check=True, stdout=subprocess.DEVNULL)
