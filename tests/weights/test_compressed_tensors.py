"""Pre-quantized compressed-tensors int8 checkpoints (written by the compressed-tensors library): their int8 weights
and scales load into the engine's int8 representation as they are, and the engine generates the greedy tokens of
the float32 model of the same dequantized weights; a config jaxpaged cannot run, or one the --quantization flag
disagrees with, is a ValueError naming the field before any weight is read."""

import json
import logging
import pathlib

import numpy as np
import pytest

from jaxpaged.models.int8_weights import dequantize_int8
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA
from tests.weights.compressed_checkpoints import (
    dequantized_weights,
    write_compressed_checkpoint,
    write_dequantized_checkpoint,
)

_PROMPTS = ["The capital of France is", "Paged attention keeps", "1, 2, 3,", "Once upon a time there was a"]
_PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, smollm2_tokenizer_dir) -> dict[str, pathlib.Path]:
    """W8A16 per channel, per tensor and per group of 32 columns, and W8A8 per channel, of one seeded model."""
    root = tmp_path_factory.mktemp("compressed")
    kinds = {"w8a16-channel": ("channel", False), "w8a16-tensor": ("tensor", False),
             "w8a16-group": ("group", False), "w8a8-channel": ("channel", True)}
    return {kind: write_compressed_checkpoint(root / kind, smollm2_tokenizer_dir, TINY_LLAMA, strategy, activations)
            for kind, (strategy, activations) in kinds.items()}


@pytest.mark.parametrize("kind", ["w8a16-channel", "w8a16-tensor", "w8a8-channel"])
def test_int8_weights_and_scales_load_as_the_file_holds_them(checkpoints, kind):
    """Channel and tensor scales: the engine's int8 values are the file's (transposed), its per-column scales the
    file's; dequantized, each layer equals weight * weight_scale."""
    loaded = load_model(str(checkpoints[kind]))
    assert loaded.quantization == kind.split("-")[0].replace("w8a16", "int8")
    reference = dequantized_weights(checkpoints[kind])
    for layer in range(TINY_LLAMA["num_hidden_layers"]):
        for name, block in _PROJECTIONS.items():
            values = loaded.params[f"layers.{name}"][layer]
            scale = loaded.params[f"layers.{name}_scale"][layer]
            assert values.dtype == np.int8 and scale.dtype == np.float32
            expected = reference[f"model.layers.{layer}.{block}.{name}.weight"].T
            np.testing.assert_array_equal(dequantize_int8(values, scale), expected, err_msg=f"{name}[{layer}]")
    np.testing.assert_array_equal(loaded.params["embed"], reference["model.embed_tokens.weight"])


def test_an_int8_lm_head_and_an_ignored_projection_load_as_the_engine_keeps_them(tmp_path, smollm2_tokenizer_dir):
    """A quantized lm_head (not ignored) is dequantized into the model dtype; a projection the checkpoint ignores
    (float in the file) is quantized per channel as it loads."""
    config = TINY_LLAMA | {"tie_word_embeddings": False}
    directory = write_compressed_checkpoint(tmp_path / "model", smollm2_tokenizer_dir, config,
                                            ignore=("re:.*layers.1.mlp.down_proj",))
    reference = dequantized_weights(directory)
    stored = _file_tensors(directory)
    assert "lm_head.weight_scale" in stored and "model.layers.0.mlp.down_proj.weight_scale" in stored
    assert "model.layers.1.mlp.down_proj.weight_scale" not in stored
    loaded = load_model(str(directory))
    np.testing.assert_array_equal(loaded.params["lm_head"], reference["lm_head.weight"].T)
    float_down = reference["model.layers.1.mlp.down_proj.weight"].T
    values, scale = loaded.params["layers.down_proj"][1], loaded.params["layers.down_proj_scale"][1]
    assert np.all(np.abs(dequantize_int8(values, scale) - float_down) <= scale / 2 * (1 + 1e-5))


def _file_tensors(directory: pathlib.Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "np") as handle:
        return list(handle.keys())


def test_group_scales_are_requantized_per_channel_within_both_roundings(checkpoints):
    """Group scales (32 columns each) become one scale per output column: the result stays within half a group step
    plus half a column step of the checkpoint's dequantized weight."""
    loaded = load_model(str(checkpoints["w8a16-group"]))
    reference = dequantized_weights(checkpoints["w8a16-group"])
    for name, block in _PROJECTIONS.items():
        values, scale = loaded.params[f"layers.{name}"][0], loaded.params[f"layers.{name}_scale"][0]
        expected = reference[f"model.layers.0.{block}.{name}.weight"].T
        group_step = np.abs(expected).max(axis=0) / 127  # the largest group step of each column, at most
        error = np.abs(dequantize_int8(values, scale) - expected)
        assert np.all(error <= (group_step + scale) / 2 * (1 + 1e-5)), name
        assert np.abs(values).max() == 127


@pytest.fixture(scope="module")
def reference_llm(checkpoints, tmp_path_factory):
    """The float32 model of the W8A16 channel checkpoint's dequantized weights (the same weights as W8A8's)."""
    from jaxpaged.llm import LLM

    target = tmp_path_factory.mktemp("dequantized") / "model"
    return LLM(str(write_dequantized_checkpoint(checkpoints["w8a16-channel"], target)), **TINY_ENGINE_OPTIONS)


@pytest.mark.parametrize("flag", [None, "int8", "compressed-tensors"])
def test_w8a16_engine_generates_the_dequantized_float_models_greedy_tokens(checkpoints, reference_llm, flag):
    from jaxpaged.llm import LLM

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    expected = [output.outputs[0].token_ids for output in reference_llm.generate(_PROMPTS, params)]
    with LLM(str(checkpoints["w8a16-channel"]), quantization=flag, **TINY_ENGINE_OPTIONS) as llm:
        assert llm.engine.runner.plan.quantization == "int8"
        got = [output.outputs[0].token_ids for output in llm.generate(_PROMPTS, params)]
    assert got == expected


def test_a_w8a8_checkpoint_runs_w8a8(checkpoints, tmp_path):
    """A W8A8 checkpoint runs its activations int8 too: the tokens of the same int8 weights (the W8A16 checkpoint,
    converted) run with quantization="w8a8"."""
    from jaxpaged.cli import main
    from jaxpaged.llm import LLM

    assert main(["convert", str(checkpoints["w8a16-channel"]), str(tmp_path / "converted")]) == 0
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runs = {}
    for name, model, flag in [("w8a8", checkpoints["w8a8-channel"], None),
                              ("converted w8a8", tmp_path / "converted", "w8a8")]:
        with LLM(str(model), quantization=flag, **TINY_ENGINE_OPTIONS) as llm:
            assert llm.engine.runner.plan.quantization == "w8a8", name
            runs[name] = [output.outputs[0].token_ids for output in llm.generate(_PROMPTS, params)]
    assert runs["w8a8"] == runs["converted w8a8"]


def _bad_checkpoint(tmp_path: pathlib.Path, **changes) -> pathlib.Path:
    """A W8A16 config with `changes` ("a.b": value sets a nested field) beside an empty weights file: reading any
    weight would fail with a safetensors error, so a config error proves nothing was read."""
    group = {"targets": ["Linear"], "input_activations": None, "output_activations": None,
             "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False,
                         "group_size": None}}
    quantization = {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
                    "config_groups": {"group_0": group}, "kv_cache_scheme": None, "sparsity_config": {}}
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = quantization
        for key in parents:
            node = node[key]
        node[leaf] = value
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA | {"model_type": "llama",
                                                                    "quantization_config": quantization}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


@pytest.mark.parametrize("changes,field", [
    ({"config_groups.group_0.weights.num_bits": 4}, "config_groups.group_0.weights.num_bits"),
    ({"config_groups.group_0.weights.symmetric": False}, "config_groups.group_0.weights.symmetric"),
    ({"config_groups.group_0.weights.type": "float"}, "config_groups.group_0.weights.type"),
    ({"config_groups.group_0.weights.strategy": "block"}, "config_groups.group_0.weights.strategy"),
    ({"config_groups.group_0.weights.strategy": "group"}, "config_groups.group_0.weights.group_size"),
    ({"config_groups.group_0.input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                                  "strategy": "tensor", "dynamic": False}},
     "config_groups.group_0.input_activations"),
    ({"format": "pack-quantized"}, "format"),
    ({"quant_method": "awq"}, "quant_method"),
    ({"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme"),
])
def test_a_scheme_jaxpaged_cannot_run_is_refused_naming_the_field(tmp_path, changes, field):
    with pytest.raises(ValueError, match=f"^quantization_config.{field}: "):
        load_model(str(_bad_checkpoint(tmp_path / "model", **changes)))


def test_a_flag_that_disagrees_with_the_checkpoint_is_refused_before_loading(tmp_path, tiny_model_dir, caplog):
    w8a8 = {"config_groups.group_0.input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                                        "strategy": "token", "dynamic": True}}
    from jaxpaged.llm import LLM

    with caplog.at_level(logging.INFO, logger="jaxpaged"):
        with pytest.raises(ValueError, match="^quantization: 'int8' disagrees with the checkpoint.*W8A8"):
            LLM(str(_bad_checkpoint(tmp_path / "w8a8", **w8a8)), quantization="int8", **TINY_ENGINE_OPTIONS)
        with pytest.raises(ValueError, match="^quantization: 'compressed-tensors' needs a checkpoint whose"):
            LLM(str(tiny_model_dir), quantization="compressed-tensors", **TINY_ENGINE_OPTIONS)
    assert not [record for record in caplog.records if "start-up plan" in record.getMessage()]


def test_an_int8_tensor_without_a_quantization_config_is_refused(tmp_path):
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA | {"model_type": "llama"}))
    save_file({"model.layers.0.input_layernorm.weight": np.zeros((64,), np.int8)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="has dtype I8.*compressed-tensors"):
        load_model(str(tmp_path))


def test_scales_the_strategy_cannot_pack_are_refused_naming_the_tensor(checkpoints, tmp_path):
    """Channel scales under a config that says groups of 32: the headers' shapes disagree, refused before loading."""
    import shutil

    target = tmp_path / "model"
    shutil.copytree(checkpoints["w8a16-channel"], target)
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"] |= {"strategy": "group", "group_size": 32}
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"weight_scale': group scales of a \((\d+), (\d+)\) weight in groups of 32 "
                                         r"must be \(\1, \d+\), got \(\1, 1\)"):
        load_model(str(target))
