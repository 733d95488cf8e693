"""Load an HF transformers checkpoint directory (config.json + one or many .safetensors) without torch."""

import json
import pathlib
from typing import Optional

import numpy as np
from safetensors import safe_open

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.weights.param_names import stack_layers

# jaxpaged layer weight -> (HF name inside model.layers.N, transpose?)
_LAYER_NAMES = {
    "input_norm": ("input_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "post_norm": ("post_attention_layernorm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
}
_GLOBAL_NAMES = {"embed": ("model.embed_tokens.weight", False), "final_norm": ("model.norm.weight", False),
                 "lm_head": ("lm_head.weight", True)}


def is_hf_checkpoint(path: pathlib.Path) -> bool:
    """A directory with config.json and at least one .safetensors file."""
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def load_hf_checkpoint(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Return (HF config dict, jaxpaged params as float32 numpy arrays)."""
    hf_config = json.loads((path / "config.json").read_text())
    cfg = ModelConfig.from_hf(hf_config)
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(path.glob("*.safetensors")):
        # "flax" keeps bfloat16 checkpoints readable (plain numpy has no bfloat16).
        with safe_open(str(file), framework="flax") as f:
            for key in f.keys():
                tensors[key] = np.asarray(f.get_tensor(key), dtype=np.float32)

    def fetch(name: str, layer: Optional[int]) -> np.ndarray:
        hf_name, transpose = _LAYER_NAMES[name] if layer is not None else _GLOBAL_NAMES[name]
        if layer is not None:
            hf_name = f"model.layers.{layer}.{hf_name}"
        if hf_name not in tensors:
            raise ValueError(f"checkpoint {path}: tensor {hf_name!r} is missing")
        value = tensors[hf_name]
        return value.T if transpose else value

    return hf_config, stack_layers(cfg, fetch)
