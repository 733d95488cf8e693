"""gpt-oss (GptOssForCausalLM): HF's greedy tokens through the engine on prompts several sliding windows long
(alternating window / full layers, attention sinks, biases, clamped SwiGLU, top-k-then-softmax routing, YaRN), with
its experts loaded from MXFP4 blocks and from the fused bfloat16 layout alike, and errors naming a missing tensor."""

import json
import pathlib
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from jaxpaged.models.families.gpt_oss import GptOssConfig, clamped_swiglu
from jaxpaged.models.param_shapes import param_shapes
from jaxpaged.models.registry import read_model_config
from jaxpaged.models.yarn import YarnScaling
from jaxpaged.runner import startup as startup_module
from jaxpaged.weights import mxfp4 as mxfp4_module
from jaxpaged.weights.loader import load_model
from tests.models.moe_checkpoints import VOCAB, engine_greedy, random_prompts, save_moe_checkpoint
from tests.models.test_hf_parity import hf_greedy

WINDOW = 8
BLOCK_SIZE = 8
CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
    max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
    swiglu_limit=0.3,  # small enough that random weights' gate and up values are clamped
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "truncate": False, "original_max_position_embeddings": 32, "rope_theta": 150000.0})
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")
PROMPTS = (5, (40, 27, 24))
"""(seed, lengths) of the prompts: 3 to 5 windows long."""


def _mxfp4_experts(model: transformers.PreTrainedModel, seed: int) -> dict[str, torch.Tensor]:
    """Random MXFP4 blocks and scales for every layer's experts, written into `model` as transformers dequantizes
    them; {checkpoint name: uint8 tensor}."""
    rng = np.random.default_rng(seed)
    packed = {}
    for index, layer in enumerate(model.model.layers):
        for name in EXPERT_WEIGHTS:
            param = getattr(layer.mlp.experts, name)  # [E, in, out]; stored [E, out, in / 32, 16]
            experts, inner, outer = param.shape
            blocks = torch.from_numpy(rng.integers(0, 256, (experts, outer, inner // 32, 16), dtype=np.uint8))
            scales = torch.from_numpy(rng.integers(118, 124, (experts, outer, inner // 32), dtype=np.uint8))
            with torch.no_grad():
                param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            prefix = f"model.layers.{index}.mlp.experts.{name}"
            packed |= {f"{prefix}_blocks": blocks, f"{prefix}_scales": scales}
    return packed


def make_gpt_oss(fused: pathlib.Path, mxfp4: pathlib.Path,
                 tokenizer_dir: pathlib.Path) -> transformers.PreTrainedModel:
    """The tiny gpt-oss saved twice, `fused` (bfloat16, as save_pretrained writes it) and `mxfp4` (its experts as
    MXFP4 blocks and scales); the HF float32 model holding those weights."""
    # Biases, embeddings and sinks scaled so that the greedy tokens vary by prompt and change when the sinks are
    # dropped or the window widened (checked by hand): each part is visible in the tokens.
    model = save_moe_checkpoint(transformers.GptOssConfig(**CONFIG), fused, tokenizer_dir, noise=0.02, embed_gain=5)
    packed = _mxfp4_experts(model, seed=1)
    with torch.no_grad():  # sinks of a few units: some heads send most of their attention to the sink
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(2.0 * torch.randn(layer.self_attn.sinks.shape).to(torch.bfloat16))
    model.save_pretrained(fused, state_dict={name: value.to(torch.bfloat16)
                                             for name, value in model.state_dict().items()})
    tensors = {name: value for name, value in load_file(str(fused / "model.safetensors")).items()
               if not name.endswith(EXPERT_WEIGHTS)}
    save_file(tensors | packed, str(mxfp4 / "model.safetensors"))
    config = json.loads((fused / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (mxfp4 / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (mxfp4 / name).write_bytes((fused / name).read_bytes())
    return model


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory, smollm2_tokenizer_dir):
    """(the HF float32 model, its fused bfloat16 checkpoint, the same with MXFP4 experts): one set of weights."""
    fused, mxfp4 = tmp_path_factory.mktemp("gpt-oss"), tmp_path_factory.mktemp("gpt-oss-mxfp4")
    return make_gpt_oss(fused, mxfp4, smollm2_tokenizer_dir), fused, mxfp4


def test_config_reads_windows_experts_and_yarn(gpt_oss):
    """The config reader takes alternating layer types, the window, the experts, the SwiGLU constants and YaRN."""
    _, fused, _ = gpt_oss
    cfg = read_model_config(json.loads((fused / "config.json").read_text()))
    assert isinstance(cfg, GptOssConfig)
    assert cfg.layer_is_sliding == (True, False) and cfg.sliding_window == WINDOW
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.swiglu_limit, cfg.swiglu_alpha) == (4, 2, 0.3, 1.702)
    assert cfg.qkv_bias and isinstance(cfg.rope_scaling, YarnScaling) and not cfg.rope_scaling.truncate


def test_greedy_tokens_match_hf_from_mxfp4(gpt_oss):
    """Prompts of 3 to 5 windows, in one batch, generate HF's float32 greedy tokens from the MXFP4 checkpoint."""
    model, _, mxfp4 = gpt_oss
    prompts = random_prompts(*PROMPTS)
    assert engine_greedy(mxfp4, prompts, 8, block_size=BLOCK_SIZE) == hf_greedy(model, prompts, 8)


def test_mxfp4_and_fused_layouts_load_the_same_parameters(gpt_oss):
    """The MXFP4 experts dequantize to the bfloat16 fused checkpoint's values; gate and up de-interleaved alike."""
    _, fused, mxfp4 = gpt_oss
    expected, got = load_model(str(fused)).params, load_model(str(mxfp4)).params
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(np.asarray(got[name], np.float32), np.asarray(expected[name], np.float32),
                                      err_msg=name)


def test_mxfp4_load_decodes_every_stored_byte_once(gpt_oss, monkeypatch):
    """Loading the MXFP4 checkpoint looks up each stored byte of codes exactly once: gate_up_proj's gate and up
    halves are dequantized apart, never the whole tensor per half."""
    _, _, mxfp4 = gpt_oss
    decoded = []
    original = mxfp4_module._dequantized_slice

    def counting(blocks, scales, dtype):
        decoded.append(np.asarray(blocks).size)
        return original(blocks, scales, dtype)

    monkeypatch.setattr(mxfp4_module, "_dequantized_slice", counting)
    load_model(str(mxfp4))
    with safe_open(str(mxfp4 / "model.safetensors"), "np") as handle:
        stored = sum(int(np.prod(handle.get_slice(name).get_shape())) for name in handle.keys()
                     if name.endswith("_blocks"))
    assert sum(decoded) == stored


def test_gate_up_columns_are_deinterleaved(gpt_oss):
    """The fused [E, H, 2I] gate_up_proj's even columns (gate) and its bias's become expert_gate(_bias), the odd
    ones (up) expert_up(_bias)."""
    model, fused, _ = gpt_oss
    params = load_model(str(fused)).params
    experts = model.model.layers[1].mlp.experts
    stored, bias = experts.gate_up_proj.detach().numpy(), experts.gate_up_proj_bias.detach().numpy()
    for name, value in (("expert_gate", stored[..., 0::2]), ("expert_up", stored[..., 1::2]),
                        ("expert_gate_bias", bias[..., 0::2]), ("expert_up_bias", bias[..., 1::2])):
        np.testing.assert_array_equal(np.asarray(params[f"layers.{name}"], np.float32)[1], value, err_msg=name)


@pytest.mark.parametrize("missing", ["model.layers.1.mlp.experts.down_proj_scales",
                                     "model.layers.0.self_attn.sinks"])
def test_missing_tensor_is_named(gpt_oss, tmp_path, missing):
    """A checkpoint without one of its tensors fails to load with an error naming it."""
    _, _, mxfp4 = gpt_oss
    tensors = load_file(str(mxfp4 / "model.safetensors"))
    del tensors[missing]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((mxfp4 / "config.json").read_text())
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        load_model(str(tmp_path))


def test_fused_checkpoint_is_what_save_pretrained_writes(gpt_oss):
    """transformers 5 writes gpt-oss's experts fused, biases beside them (the layout the loader reads)."""
    _, fused, _ = gpt_oss
    with safe_open(str(fused / "model.safetensors"), "np") as handle:
        shapes = {name: handle.get_slice(name).get_shape() for name in handle.keys()}
    assert shapes["model.layers.0.mlp.experts.gate_up_proj"] == [4, 64, 64]
    assert shapes["model.layers.0.mlp.experts.gate_up_proj_bias"] == [4, 64]
    assert shapes["model.layers.0.self_attn.sinks"] == [4]


GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "eos_token_id": 200002, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "tie_word_embeddings": False, "vocab_size": 201088,
}
"""openai/gpt-oss-20b's config.json (experts_per_token only: num_experts_per_tok is read from it when absent)."""


def test_released_config_reads_as_published():
    """gpt-oss-20b's config: 32 experts, top 4, 128-token windows on even layers, YaRN x32 over 4096, untruncated;
    its experts' gate, up and down are [24, 32, 2880, 2880] each."""
    cfg = read_model_config(GPT_OSS_20B)
    assert isinstance(cfg, GptOssConfig)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.sliding_window) == (32, 4, 128)
    assert cfg.layer_is_sliding[:3] == (True, False, True) and cfg.rope_theta == 150000
    assert isinstance(cfg.rope_scaling, YarnScaling)
    assert cfg.rope_scaling.factor == 32 and not cfg.rope_scaling.truncate
    shapes = param_shapes(cfg)
    for name in ("expert_gate", "expert_up", "expert_down"):
        assert shapes[f"layers.{name}"] == (24, 32, 2880, 2880)
    assert shapes["layers.sinks"] == (24, 64) and shapes["layers.o_bias"] == (24, 2880)
    assert "layers.gate_proj" not in shapes


def test_clamped_swiglu_matches_transformers_and_a_hand_worked_case():
    """clamped_swiglu(gate, up) equals transformers' GptOssExperts._apply_gate on the interleaved columns, and at
    gate 10, up -10 (both clamped at limit 7) gives (-7 + 1) * 7 * sigmoid(1.702 * 7)."""
    rng = np.random.default_rng(3)
    gate, up = rng.normal(0, 5, (6, 8)).astype(np.float32), rng.normal(0, 5, (6, 8)).astype(np.float32)
    experts = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(
        transformers.GptOssConfig(hidden_size=8, intermediate_size=8, num_local_experts=1))
    interleaved = np.stack([gate, up], axis=-1).reshape(6, 16)
    expected = experts._apply_gate(torch.from_numpy(interleaved)).numpy()
    got = np.asarray(clamped_swiglu(jnp.asarray(gate), jnp.asarray(up), alpha=1.702, limit=7.0))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    hand = np.asarray(clamped_swiglu(jnp.full((1, 1), 10.0), jnp.full((1, 1), -10.0), alpha=1.702, limit=7.0))
    assert hand[0, 0] == pytest.approx(-6 * 7 / (1 + np.exp(-1.702 * 7)), rel=1e-6)


@pytest.mark.slow  # another engine compile; the CPU otherwise always unrolls
def test_greedy_tokens_match_hf_with_stacked_scanned_layers(gpt_oss):
    """The GPU / TPU arrangement (layers stacked and scanned, each layer's window picked by lax.cond, its sinks and
    biases sliced from the stacks) on the CPU generates HF's greedy tokens too."""
    model, _, mxfp4 = gpt_oss
    prompts = random_prompts(*PROMPTS)
    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(startup_module, "unroll_layers_on", lambda platform: False)
        assert engine_greedy(mxfp4, prompts, 8, block_size=BLOCK_SIZE) == hf_greedy(model, prompts, 8)
