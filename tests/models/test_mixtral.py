"""Mixtral (MixtralForCausalLM): HF's greedy tokens through the engine, both checkpoint layouts of its experts, and
an error naming a missing expert tensor."""

import re
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from jaxpaged.weights.loader import load_model
from tests.models.moe_checkpoints import VOCAB, engine_greedy, random_prompts, save_moe_checkpoint
from tests.models.test_hf_parity import hf_greedy

CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
    max_position_embeddings=256, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory, smollm2_tokenizer_dir):
    """(the HF float32 model, its per-expert checkpoint directory)."""
    directory = tmp_path_factory.mktemp("mixtral")
    model = save_moe_checkpoint(transformers.MixtralConfig(**CONFIG), directory, smollm2_tokenizer_dir)
    return model, directory


def test_greedy_tokens_match_hf(mixtral):
    """Prompts over several blocks, in a batch, generate HF's float32 greedy tokens exactly."""
    model, directory = mixtral
    prompts = random_prompts(3, (37, 20, 5))
    assert engine_greedy(directory, prompts, 8, block_size=8) == hf_greedy(model, prompts, 8)


def test_per_expert_checkpoint_is_what_save_pretrained_writes(mixtral):
    """transformers 5 writes Mixtral's experts one tensor per expert (block_sparse_moe.experts.N.w1/w2/w3)."""
    _, directory = mixtral
    names = _tensor_names(directory)
    assert "model.layers.1.block_sparse_moe.experts.3.w3.weight" in names
    assert "model.layers.0.block_sparse_moe.gate.weight" in names


def _tensor_names(directory) -> set[str]:
    with safe_open(str(directory / "model.safetensors"), "np") as handle:
        return set(handle.keys())


def test_fused_layout_loads_the_same_parameters(mixtral, tmp_path):
    """transformers 5's fused layout (mlp.experts.gate_up_proj [E, 2I, H], mlp.gate) gives the same parameters as
    the per-expert files."""
    model, directory = mixtral
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file({name: value.to(torch.bfloat16).contiguous() for name, value in model.state_dict().items()},
              str(fused / "model.safetensors"))
    (fused / "config.json").write_text((directory / "config.json").read_text())
    assert "model.layers.0.mlp.experts.gate_up_proj" in _tensor_names(fused)
    expected, got = load_model(str(directory)).params, load_model(str(fused)).params
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(expected[name]), err_msg=name)


@pytest.mark.parametrize("missing, named", [
    ("model.layers.1.block_sparse_moe.experts.2.w3.weight", "model.layers.1.block_sparse_moe.experts.2.w3.weight"),
    ("model.layers.0.block_sparse_moe.gate.weight",
     "'model.layers.0.block_sparse_moe.gate.weight' or 'model.layers.0.mlp.gate.weight'"),
])
def test_missing_tensor_is_named(mixtral, tmp_path, missing, named):
    """A checkpoint lacking one expert's w3, or a router, fails to load with an error naming what it looked for."""
    _, directory = mixtral
    tensors = load_file(str(directory / "model.safetensors"))
    del tensors[missing]
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(tensors, str(broken / "model.safetensors"))
    (broken / "config.json").write_text((directory / "config.json").read_text())
    with pytest.raises(ValueError, match=re.escape(named)):
        load_model(str(broken))
