"""Multimodal checkpoints (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration) load their text tower
and generate what HF's text-only generate does on the same model; both saved prefixes load alike."""

import pathlib
import shutil
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers

from jaxpaged.config import EngineConfig
from jaxpaged.llm import LLM
from jaxpaged.models.families.text_towers import TEXT_TOWER_MAPPER, text_config_of
from jaxpaged.models.registry import read_model_config
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.models.test_hf_parity import BLOCK_SIZE, assert_close, hf_greedy, hf_logits, run_step, save_with_tokenizer

TEXT: dict = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
VISION: dict = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                    patch_size=14)

WRAPPERS = {
    # Windows of 8 tokens, so the prompts outgrow them; one global layer with its own RoPE base and linear scaling.
    "gemma3": lambda: transformers.Gemma3Config(
        text_config=TEXT | dict(sliding_window=8, query_pre_attn_scalar=12,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                 "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": 1000000.0}}),
        vision_config=VISION, mm_tokens_per_image=4),
    "mistral3": lambda: transformers.Mistral3Config(
        text_config=TEXT | dict(model_type="mistral", sliding_window=None),
        vision_config=VISION | dict(model_type="pixtral", head_dim=16), tie_word_embeddings=False),
}
PROMPTS = [[5, 17, 300, 4000, 9, 12, 77, 1000, 23, 8, 41, 600, 2, 19], [7, 8, 9]]
NUM_NEW_TOKENS = 8


def save_wrapper(kind: str, directory: pathlib.Path, tokenizer_dir: pathlib.Path) -> transformers.PreTrainedModel:
    """A seeded random multimodal model of `kind` saved (float32) with a tokenizer beside it; returned in eval mode."""
    torch.manual_seed(0)
    config = WRAPPERS[kind]()
    model_class = {"gemma3": transformers.Gemma3ForConditionalGeneration,
                   "mistral3": transformers.Mistral3ForConditionalGeneration}[kind]
    return save_with_tokenizer(model_class(config).eval(), directory, tokenizer_dir)


@pytest.fixture(scope="module", params=sorted(WRAPPERS))
def wrapper_checkpoint(request, tmp_path_factory, smollm2_tokenizer_dir):
    directory = tmp_path_factory.mktemp(f"mm-{request.param}")
    return request.param, save_wrapper(request.param, directory, smollm2_tokenizer_dir), directory


def test_text_tower_greedy_matches_hf_text_only_generate(wrapper_checkpoint):
    """The engine on a saved multimodal checkpoint generates HF's text-only greedy tokens (float32)."""
    _, model, directory = wrapper_checkpoint
    llm = LLM(str(directory), dtype="float32", attention_backend="xla", max_model_len=64, max_num_seqs=4,
              max_num_batched_tokens=32, compilation_cache_dir="")
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy(model, PROMPTS, NUM_NEW_TOKENS)


def test_text_tower_logits_match_hf_at_every_position(wrapper_checkpoint):
    """Every position's logits of a prompt longer than Gemma's window match HF's text-only forward (float32)."""
    _, model, directory = wrapper_checkpoint
    config = EngineConfig.from_options(block_size=BLOCK_SIZE, num_kv_blocks=32, max_model_len=64,
                                       max_num_batched_tokens=32, max_num_seqs=16, dtype="float32",
                                       attention_backend="xla",
                                       disable_hybrid_kv_cache_manager=True)
    runner = ModelRunner(load_model(str(directory)), config)
    tokens = PROMPTS[0]
    assert_close(run_step(runner, [(tokens, 0, [3, 1, 4, 2])]), hf_logits(model, tokens))


def test_the_other_prefix_loads_the_same_weights(wrapper_checkpoint, tmp_path):
    """A checkpoint whose text model sits under the other prefix (model.language_model. + lm_head. rather than
    language_model.model. + language_model.lm_head., or back) loads to the same parameters."""
    _, _, directory = wrapper_checkpoint
    renamed = {"language_model.model.": "model.language_model.", "language_model.lm_head.": "lm_head.",
               "model.language_model.": "language_model.model.", "lm_head.": "language_model.lm_head.",
               "vision_tower.": "model.vision_tower.", "multi_modal_projector.": "model.multi_modal_projector."}

    def rename(name: str) -> str:
        for old, new in renamed.items():
            if name.startswith(old):
                return new + name[len(old):]
        return name

    tensors = safetensors.torch.load_file(directory / "model.safetensors")
    for name in (*directory.iterdir(),):
        if name.name != "model.safetensors":
            shutil.copy(name, tmp_path / name.name)
    safetensors.torch.save_file({rename(k): v for k, v in tensors.items()}, tmp_path / "model.safetensors",
                                metadata={"format": "pt"})
    assert {rename(k) for k in tensors} != set(tensors)
    original, other = load_model(str(directory)), load_model(str(tmp_path))
    assert sorted(original.params) == sorted(other.params)
    for name, value in original.params.items():
        np.testing.assert_array_equal(np.asarray(other.params[name]), np.asarray(value), err_msg=name)


def test_vision_tensors_are_dropped_and_text_tensors_renamed():
    """The mapper renames both layouts' text tensors to the causal LM's names and drops the vision side."""
    mapped = TEXT_TOWER_MAPPER.map_names([
        "language_model.model.layers.0.self_attn.q_proj.weight", "language_model.lm_head.weight",
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight", "multi_modal_projector.linear_1.weight",
        "model.vision_tower.patch_conv.weight", "model.multi_modal_projector.norm.weight"])
    assert mapped == {"model.layers.0.self_attn.q_proj.weight": "language_model.model.layers.0.self_attn.q_proj.weight",
                      "lm_head.weight": "language_model.lm_head.weight"}
    assert TEXT_TOWER_MAPPER.map_names(["model.language_model.norm.weight", "lm_head.weight"]) == {
        "model.norm.weight": "model.language_model.norm.weight", "lm_head.weight": "lm_head.weight"}


def test_text_config_takes_what_it_lacks_from_the_top_level():
    """text_config's own keys win, except the wrapper's eos_token_id / tie_word_embeddings; vocab and token ids the
    text config lacks come from the top level."""
    raw = dict(architectures=["Gemma3ForConditionalGeneration"], vocab_size=500, bos_token_id=2, eos_token_id=[1, 106],
               tie_word_embeddings=True, vision_config={"hidden_size": 32},
               text_config={k: v for k, v in TEXT.items() if k not in ("vocab_size", "bos_token_id")}
               | dict(eos_token_id=1, tie_word_embeddings=False, hidden_size=64))
    merged = text_config_of(raw)
    assert (merged["vocab_size"], merged["bos_token_id"], merged["eos_token_id"], merged["tie_word_embeddings"]) == (
        500, 2, [1, 106], True)
    cfg = read_model_config(raw)
    assert (cfg.architecture, cfg.vocab_size, cfg.hidden_size, cfg.eos_token_ids, cfg.qk_norm, cfg.norm_offset) == (
        "Gemma3ForConditionalGeneration", 500, 64, (1, 106), True, 1.0)


def test_a_hub_style_sparse_gemma3_config_reads_as_transformers_fills_it():
    """google/gemma-3-4b-it's config.json lists few text fields: the rest are Gemma3TextConfig's defaults, as
    transformers reads them (heads, head_dim, vocab, RoPE bases, one global layer in six, the query scalar)."""
    raw: dict[str, Any] = dict(
        architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3", eos_token_id=[1, 106],
        text_config=dict(hidden_size=2560, intermediate_size=10240, model_type="gemma3_text", num_hidden_layers=34,
                         rope_scaling={"factor": 8.0, "rope_type": "linear"}, sliding_window=1024),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=1152, image_size=896, intermediate_size=4304,
                           num_attention_heads=16, num_hidden_layers=27, patch_size=14))
    cfg = read_model_config(raw)
    hf: Any = transformers.Gemma3Config(**{k: v for k, v in raw.items() if k != "architectures"}).text_config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers)
    assert (cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps) == (
        hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.rms_norm_eps)
    assert cfg.layer_is_sliding == tuple(kind == "sliding_attention" for kind in hf.layer_types)
    assert cfg.sliding_window == hf.sliding_window == 1024
    rope = hf.rope_parameters
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rope_linear_factor) == (
        rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"],
        rope["full_attention"]["factor"])
    assert cfg.attn_scale == hf.query_pre_attn_scalar ** -0.5
    assert (cfg.eos_token_ids, cfg.tie_word_embeddings) == ((1, 106), True)
