"""Random PEFT LoRA adapters written as PEFT saves them (adapter_config.json + adapter_model.safetensors), and the
merged HF reference model W + scaling * B @ A, built by hand with torch (the tests' independent reference)."""

import copy
import json
import math
import pathlib
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import save_file

_MODULE_GROUP = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                 "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_peft_adapter(directory: pathlib.Path, hf_config: dict[str, Any], *, rank: int, alpha: float,
                       targets: list[str], seed: int, scale: float = 0.3, use_rslora: bool = False,
                       config_overrides: Optional[dict[str, Any]] = None) -> dict[str, torch.Tensor]:
    """Write a random adapter of `hf_config`'s Llama into `directory`; returns its tensors by PEFT name."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    hidden, inter = hf_config["hidden_size"], hf_config["intermediate_size"]
    head_dim = hf_config["head_dim"]
    q_dim, kv_dim = hf_config["num_attention_heads"] * head_dim, hf_config["num_key_value_heads"] * head_dim
    dims = {"q_proj": (hidden, q_dim), "k_proj": (hidden, kv_dim), "v_proj": (hidden, kv_dim),
            "o_proj": (q_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}
    tensors = {}
    for layer in range(hf_config["num_hidden_layers"]):
        for target in targets:
            inner, outer = dims[target]
            prefix = f"base_model.model.model.layers.{layer}.{_MODULE_GROUP[target]}.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.tensor(
                generator.normal(0, scale, (rank, inner)), dtype=torch.float32)
            tensors[f"{prefix}.lora_B.weight"] = torch.tensor(
                generator.normal(0, scale, (outer, rank)), dtype=torch.float32)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": targets, "bias": "none",
              "use_rslora": use_rslora, "lora_dropout": 0.0, "task_type": "CAUSAL_LM",
              "base_model_name_or_path": "tiny-llama", **(config_overrides or {})}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return tensors


def merged_model(base: torch.nn.Module, tensors: dict[str, torch.Tensor], rank: int, alpha: float,
                 use_rslora: bool = False) -> torch.nn.Module:
    """A copy of the HF model `base` with each adapted weight replaced by W + scaling * B @ A."""
    scaling = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    merged = copy.deepcopy(base)
    modules = dict(merged.named_modules())
    with torch.no_grad():
        for name, a in tensors.items():
            if ".lora_A." not in name:
                continue
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            module_path = name[len("base_model.model."):name.index(".lora_A.")]
            module = modules[module_path]
            assert isinstance(module, torch.nn.Linear)
            module.weight += scaling * (b @ a)
    return merged
