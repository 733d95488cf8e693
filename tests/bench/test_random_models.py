"""Random bench models (`model: random:NAME`): made once as HF checkpoints the registry reads, and the shipped MoE pair
has the sizes its configs claim (~0.7B total; the dense twin's weights equal the MoE's active ones per token)."""

import json

import numpy as np
import pytest
import transformers

from jaxpaged.bench.random_models import RANDOM_MODELS, is_random_model, materialize
from jaxpaged.models.moe_decoder import MoeModelConfig
from jaxpaged.models.param_shapes import param_shapes
from jaxpaged.models.registry import read_model_config

TINY_SPEC = {"tiny_moe": ("Qwen3MoeConfig", dict(vocab_size=49152, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                  head_dim=16, moe_intermediate_size=8, num_experts=4,
                                                  num_experts_per_tok=2))}


def _config(name: str):
    config_class, arguments = RANDOM_MODELS[name]
    return read_model_config(getattr(transformers, config_class)(**arguments).to_dict())


@pytest.mark.slow  # builds and saves a model through torch and transformers
def test_materialize_writes_once_and_refuses_unknown_names(tmp_path):
    """The first use writes config, weights and tokenizer; the second reads the cache; an unknown name is refused."""
    directory = materialize("random:tiny_moe", tmp_path, TINY_SPEC)
    config_file = tmp_path / "tiny_moe" / "config.json"
    assert directory == str(tmp_path / "tiny_moe") and (tmp_path / "tiny_moe" / "tokenizer.json").is_file()
    written = config_file.stat().st_mtime_ns
    assert materialize("random:tiny_moe", tmp_path, TINY_SPEC) == directory
    assert config_file.stat().st_mtime_ns == written
    assert read_model_config(json.loads(config_file.read_text())).architecture == "Qwen3MoeForCausalLM"
    assert is_random_model("random:tiny_moe") and not is_random_model("/models/x") and not is_random_model(None)
    with pytest.raises(ValueError, match="model: 'random:nope'"):
        materialize("random:nope", tmp_path, TINY_SPEC)


def test_the_moe_pair_has_equal_active_parameters():
    """qwen3_moe_0.7b holds 0.5-1B parameters; top 8 of its experts per token hold as many weights as the dense
    twin's MLP, and everything else is the same shape."""
    moe, dense = _config("qwen3_moe_0.7b"), _config("qwen3_dense_0.7b_active")
    assert isinstance(moe, MoeModelConfig)
    moe_shapes, dense_shapes = param_shapes(moe), param_shapes(dense)
    total = sum(int(np.prod(shape)) for shape in moe_shapes.values())
    assert 0.5e9 < total < 1e9
    experts = sum(int(np.prod(moe_shapes[f"layers.expert_{p}"])) for p in ("gate", "up", "down"))
    active_experts = experts * moe.num_experts_per_tok // moe.num_experts
    dense_mlp = sum(int(np.prod(dense_shapes[f"layers.{p}_proj"])) for p in ("gate", "up", "down"))
    assert active_experts == dense_mlp
    shared = set(moe_shapes) & set(dense_shapes)
    assert all(moe_shapes[name] == dense_shapes[name] for name in shared)
