"""The model registry: every architecture resolves to its entry, an unknown one is refused by name, checkpoint names
are rewritten by prefix rules, and a family registered in a test (a new entry over the shared decoder) loads and
generates through the registry alone."""

import dataclasses
import json
import shutil

import pytest

from jaxpaged.models import registry
from jaxpaged.models.families.llama import HF_NAMES as LLAMA_HF_NAMES
from jaxpaged.models.families.llama import read_llama_config
from jaxpaged.models.llama import LlamaForCausalLM
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.registry import read_model_config
from jaxpaged.models.weight_names import WeightsMapper
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA

EXPECTED_ARCHITECTURES = ["Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
                          "GptOssForCausalLM", "LlamaForCausalLM", "Mistral3ForConditionalGeneration",
                          "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
                          "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]
EXPERT_FIELDS = dict(num_local_experts=4, num_experts_per_tok=2)
"""What a mixture-of-experts family's reader needs beyond TINY_LLAMA (dense readers ignore it)."""
# What each architecture's reader must make of the same config (sliding_window 8, use_sliding_window unset):
# (qkv_bias, qk_norm, sliding_window, norm_offset) as transformers' model of that name behaves.
EXPECTED_VARIANTS = {
    "LlamaForCausalLM": (False, False, None, 0.0),
    "MistralForCausalLM": (False, False, 8, 0.0),
    "Qwen2ForCausalLM": (True, False, None, 0.0),  # Qwen configs carry a window only use_sliding_window enables
    "Qwen3ForCausalLM": (False, True, None, 0.0),
    "Qwen3MoeForCausalLM": (False, True, None, 0.0),  # Qwen3's attention (its experts: test_qwen3_moe.py)
    "Qwen2MoeForCausalLM": (True, False, None, 0.0),  # Qwen2's attention
    "Gemma2ForCausalLM": (False, False, 8, 1.0),
    "Gemma3ForCausalLM": (False, True, 8, 1.0),
    # The multimodal wrappers read as their text models (a flat config is its own text_config).
    "Gemma3ForConditionalGeneration": (False, True, 8, 1.0),
    "Mistral3ForConditionalGeneration": (False, False, 8, 0.0),
    "MixtralForCausalLM": (False, False, 8, 0.0),  # Mistral's attention: the window applies whenever set
    "GptOssForCausalLM": (True, False, 8, 0.0),  # attention_bias defaults to True
}


def test_the_supported_architectures_are_the_llama_family_and_gemma():
    """The registry holds exactly the architectures the docs list (models/registry.py, docs/features.md#models)."""
    assert registry.supported_architectures() == EXPECTED_ARCHITECTURES


@pytest.mark.parametrize("architecture", EXPECTED_ARCHITECTURES)
def test_every_architecture_resolves_and_reads_its_config(architecture):
    """Each architecture name resolves to its own entry, whose reader sets that family's variant fields."""
    entry = registry.resolve(architecture)
    assert entry.architecture == architecture
    cfg = read_model_config(dict(TINY_LLAMA, **EXPERT_FIELDS, architectures=[architecture], sliding_window=8))
    assert cfg.architecture == architecture
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.sliding_window, cfg.norm_offset) == EXPECTED_VARIANTS[architecture]
    assert (cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim) == (2, 4, 2, 16)


@pytest.mark.parametrize("architecture", EXPECTED_ARCHITECTURES)
def test_a_config_without_architectures_resolves_by_model_type(architecture):
    """A config.json that names only its model_type ("qwen2", "gemma3_text") reads as that type's architecture."""
    model_type = registry.resolve(architecture).model_type
    assert model_type is not None
    assert read_model_config(dict(TINY_LLAMA, **EXPERT_FIELDS, model_type=model_type)).architecture == architecture


def test_gguf_architectures_resolve_to_their_llama_family_entry():
    """GGUF's general.architecture names map to the HF architectures they load as; Gemma has no GGUF reader."""
    by_gguf = {name: registry.resolve_gguf(name)[0].architecture for name in ("llama", "mistral", "qwen2", "qwen3")}
    assert by_gguf == {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                       "qwen3": "Qwen3ForCausalLM"}
    with pytest.raises(ValueError, match=r"GGUF architecture 'gemma2' is not supported; supported: \['llama'"):
        registry.resolve_gguf("gemma2")


def test_an_unknown_architecture_is_refused_naming_it_and_the_supported_ones():
    """An architecture no entry has gets `architecture: 'X' is not supported` listing every supported one."""
    with pytest.raises(ValueError) as refused:
        read_model_config(dict(TINY_LLAMA, architectures=["FalconForCausalLM"]))
    assert str(refused.value) == ("architecture: 'FalconForCausalLM' is not supported; "
                                  f"supported: {EXPECTED_ARCHITECTURES}")


def test_an_unknown_model_type_without_architectures_is_refused_naming_it():
    """A config with neither a known architecture nor a known model_type is refused with its model_type."""
    with pytest.raises(ValueError, match=r"architecture: \"<model_type 'falcon'>\" is not supported"):
        read_model_config(dict(TINY_LLAMA, model_type="falcon"))


def test_an_hf_checkpoint_of_an_unknown_architecture_is_refused_before_its_weights(tmp_path):
    """load_model on a directory whose config names an unsupported architecture fails with the registry's error."""
    from jaxpaged.weights.loader import load_model

    (tmp_path / "config.json").write_text(json.dumps(dict(TINY_LLAMA, architectures=["PhiForCausalLM"])))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the architecture is refused first
    with pytest.raises(ValueError, match=r"architecture: 'PhiForCausalLM' is not supported; supported: \[.*Qwen3"):
        load_model(str(tmp_path))


def test_the_weights_mapper_rewrites_the_first_matching_prefix_and_drops_none():
    """Prefix rules apply in order, only at the start of a name; a None rule drops the tensor; others pass."""
    mapper = WeightsMapper((("model.language_model.", "model."), ("language_model.model.", "model."),
                            ("language_model.lm_head.", "lm_head."), ("vision_tower.", None)))
    mapped = mapper.map_names(["model.language_model.layers.0.mlp.up_proj.weight", "language_model.lm_head.weight",
                               "vision_tower.blocks.0.weight", "multi_modal_projector.weight",
                               "x.model.language_model.y"])
    assert mapped == {"model.layers.0.mlp.up_proj.weight": "model.language_model.layers.0.mlp.up_proj.weight",
                      "lm_head.weight": "language_model.lm_head.weight",
                      "multi_modal_projector.weight": "multi_modal_projector.weight",
                      "x.model.language_model.y": "x.model.language_model.y"}


def test_two_checkpoint_tensors_mapped_to_one_name_are_refused():
    """A mapper that would make two tensors one parameter raises naming both, rather than picking one."""
    mapper = WeightsMapper((("language_model.", ""),))
    with pytest.raises(ValueError, match=r"'language_model.model.norm.weight' and 'model.norm.weight' both map"):
        mapper.map_names(["language_model.model.norm.weight", "model.norm.weight"])


def test_gemma_names_differ_from_llamas_only_in_its_norms():
    """Gemma's entry spells its four norms per layer its way and shares every other name with the Llama family."""
    gemma = registry.resolve("Gemma2ForCausalLM").hf_names
    differing = {name for name in gemma.layer if LLAMA_HF_NAMES.layer.get(name) != gemma.layer[name]}
    assert differing == {"post_norm", "attn_out_norm", "mlp_out_norm"}
    assert gemma.tensor("post_norm", 3).name == "model.layers.3.pre_feedforward_layernorm.weight"
    assert gemma.globals == LLAMA_HF_NAMES.globals


def test_a_familys_layer_weights_come_from_its_config():
    """param_shapes asks the config its family's reader made for the layer weights: Gemma's adds its two sandwich
    norms to the shared decoder's, which is all a Llama has."""
    from jaxpaged.models.param_shapes import param_shapes

    config = dict(TINY_LLAMA, sliding_window=8)
    llama = param_shapes(read_model_config(dict(config, architectures=["LlamaForCausalLM"])))
    gemma = param_shapes(read_model_config(dict(config, architectures=["Gemma2ForCausalLM"])))
    assert set(gemma) - set(llama) == {"layers.attn_out_norm", "layers.mlp_out_norm"}
    assert set(llama) <= set(gemma)
    assert gemma["layers.attn_out_norm"] == (2, 64)


class ThrowawayDecoder(LlamaForCausalLM):
    """The shared decoder under another name, recording each build: proves the runner asks the registry."""

    built: list[str] = []

    def __init__(self, cfg, params, packed=False, int8_matmul=None):
        ThrowawayDecoder.built.append(cfg.architecture)
        super().__init__(cfg, params, packed=packed, int8_matmul=int8_matmul)


def _renamed_checkpoint(source, target, prefix: str):
    """`source` (an HF Llama directory) with its config naming ThrowawayForCausalLM and every "model." tensor
    stored under `prefix` instead."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"architectures": ["ThrowawayForCausalLM"],
                                                             "model_type": "throwaway"}))
    [weights] = target.glob("*.safetensors")
    tensors = load_file(weights)
    save_file({prefix + name[len("model."):] if name.startswith("model.") else name: value
               for name, value in tensors.items()}, weights, metadata={"format": "pt"})
    return target


def _greedy_tokens(directory, prompt: list[int]) -> list[int]:
    """8 greedy tokens of an engine on the checkpoint at `directory` (no warm-up: only the steps it runs compile)."""
    from jaxpaged.config import EngineConfig
    from jaxpaged.engine import LLMEngine
    from jaxpaged.sampling.params import SamplingParams
    from jaxpaged.weights.loader import load_model

    config = EngineConfig.from_options(**TINY_ENGINE_OPTIONS | dict(max_num_seqs=2, max_num_batched_tokens=16))
    engine = LLMEngine(load_model(str(directory)), config, warmup=False)
    try:
        engine.add_request("r", {"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=8,
                                                                               ignore_eos=True))
        finished = []
        while engine.has_unfinished_requests():
            finished += [output for output in engine.step() if output.finished]
        return list(finished[0].outputs[0].token_ids)
    finally:
        engine.close()


def test_a_family_registered_in_a_test_generates_the_llama_entrys_tokens(tiny_model_dir, tmp_path, monkeypatch):
    """A new family is one entry: the Llama reader under another architecture name, its checkpoint's "backbone."
    tensors mapped by one prefix rule, its own model class; through the registry alone it loads and generates the
    Llama entry's greedy tokens on the same weights."""
    entry = ModelEntry("ThrowawayForCausalLM", read_llama_config,
                       dataclasses.replace(LLAMA_HF_NAMES, mapper=WeightsMapper((("backbone.", "model."),))),
                       model_class=ThrowawayDecoder, model_type="throwaway")
    monkeypatch.setattr(ThrowawayDecoder, "built", [])
    renamed = _renamed_checkpoint(tiny_model_dir, tmp_path / "throwaway", "backbone.")
    from jaxpaged.weights.loader import load_model

    without_rule = dataclasses.replace(entry, hf_names=LLAMA_HF_NAMES)  # the prefix rule is what finds the weights
    monkeypatch.setitem(registry.REGISTRY, entry.architecture, without_rule)
    with pytest.raises(ValueError, match=r"tensor 'model\.\S+' is missing"):
        load_model(str(renamed))
    monkeypatch.setitem(registry.REGISTRY, entry.architecture, entry)
    prompt = [5, 17, 301, 42, 9000, 77, 3]
    expected = _greedy_tokens(tiny_model_dir, prompt)
    assert ThrowawayDecoder.built == []  # the Llama entry builds its own class
    assert len(expected) == 8
    assert _greedy_tokens(renamed, prompt) == expected
    assert ThrowawayDecoder.built == ["ThrowawayForCausalLM"]
