"""Qwen3-MoE through the whole engine generates HF transformers' greedy tokens (float32) on tiny random models:
norm_topk_prob on and off, dense layers mixed in, both checkpoint layouts, a batch routed to one expert."""

import logging
import pathlib
import shutil
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from tests.models.conftest import TINY

BLOCK_SIZE = 4
NUM_NEW_TOKENS = 6

CONFIGS = {
    # Two layers, every one with experts, weights renormalised over the top 2.
    "normed": dict(num_hidden_layers=2, norm_topk_prob=True),
    # Three layers, the middle one dense (mlp_only_layers), weights not renormalised.
    "mixed": dict(num_hidden_layers=3, norm_topk_prob=False, mlp_only_layers=[1]),
}


def make_qwen3_moe(directory: pathlib.Path, tokenizer_dir: pathlib.Path,
                   config_class: type[transformers.PretrainedConfig] = transformers.Qwen3MoeConfig,
                   **overrides) -> transformers.PreTrainedModel:
    """A seeded random tiny Qwen3-MoE (or another `config_class`: Qwen2-MoE) saved (bfloat16-rounded values, float32
    file) beside SmolLM2's tokenizer; the float32 HF model with those weights."""
    torch.manual_seed(0)
    settings: dict[str, Any] = TINY | dict(intermediate_size=48, moe_intermediate_size=16, num_experts=8,
                                           num_experts_per_tok=2, tie_word_embeddings=False) | overrides
    config = config_class(**settings)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):  # HF starts them at 1 and 0: random ones are observable
                param.add_(0.1 * torch.randn_like(param))
            param.copy_(param.to(torch.bfloat16).to(torch.float32))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return model


def fuse_experts(directory: pathlib.Path) -> None:
    """Rewrite the checkpoint's per-expert tensors as transformers 5's fused 3-D ones: gate_up_proj [E, 2I, H] (gate
    half first) and down_proj [E, H, I]."""
    [file] = directory.glob("*.safetensors")
    tensors = load_file(file)
    fused = {}
    for name in list(tensors):
        if ".mlp.experts.0.gate_proj.weight" not in name:
            continue
        prefix = name[:name.index("experts.0.")] + "experts."
        count = sum(1 for key in tensors if key.startswith(prefix) and key.endswith(".gate_proj.weight"))
        take = [[tensors.pop(f"{prefix}{e}.{proj}.weight") for e in range(count)]
                for proj in ("gate_proj", "up_proj", "down_proj")]
        fused[prefix + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(take[0], take[1])])
        fused[prefix + "down_proj"] = np.stack(take[2])
    save_file(tensors | fused, str(file), metadata={"format": "pt"})


def hf_greedy(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_NEW_TOKENS,
                             min_new_tokens=NUM_NEW_TOKENS, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine_greedy(directory: pathlib.Path, prompts: list[list[int]], **options) -> list[list[int]]:
    llm = LLM(str(directory), block_size=BLOCK_SIZE, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4,
              num_kv_blocks=48, dtype="float32", attention_backend="xla", compilation_cache_dir="", **options)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


PROMPTS = [np.random.default_rng(seed).integers(0, 160, length).tolist() for seed, length in ((1, 13), (2, 5), (3, 9))]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def qwen3_moe(request, tmp_path_factory, smollm2_tokenizer_dir):
    """(config name, checkpoint dir, HF model) of each tiny Qwen3-MoE."""
    directory = tmp_path_factory.mktemp(f"qwen3-moe-{request.param}")
    return request.param, directory, make_qwen3_moe(directory, smollm2_tokenizer_dir, **CONFIGS[request.param])


@pytest.fixture(scope="module")
def mixed_moe(tmp_path_factory, smollm2_tokenizer_dir):
    """(checkpoint dir, HF model) of the tiny Qwen3-MoE with a dense layer: the layouts and int8 tests' model (one
    engine build each, not one per config)."""
    directory = tmp_path_factory.mktemp("qwen3-moe-layouts")
    return directory, make_qwen3_moe(directory, smollm2_tokenizer_dir, **CONFIGS["mixed"])


def test_greedy_tokens_equal_hf(qwen3_moe):
    """A batch of prompts over several blocks (13 tokens: 4 blocks; chunked in 16-token steps) generates HF's
    greedy tokens exactly, with and without norm_topk_prob, with a dense layer among the MoE ones."""
    _, directory, hf_model = qwen3_moe
    assert engine_greedy(directory, PROMPTS) == [hf_greedy(hf_model, p) for p in PROMPTS]


def test_fused_expert_layout_loads_the_same(mixed_moe, tmp_path):
    """The fused 3-D layout (gate_up_proj [E, 2I, H], down_proj [E, H, I]) generates the same tokens as HF."""
    directory, hf_model = mixed_moe
    fused = tmp_path / "fused"
    shutil.copytree(directory, fused)
    fuse_experts(fused)
    assert engine_greedy(fused, PROMPTS[:1]) == [hf_greedy(hf_model, PROMPTS[0])]


def test_missing_expert_tensor_is_named(mixed_moe, tmp_path):
    """A checkpoint missing one expert's tensor fails to load with an error naming that tensor."""
    directory, _ = mixed_moe
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    [file] = broken.glob("*.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.0.mlp.experts.5.up_proj.weight"]
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.5\.up_proj\.weight"):
        engine_greedy(broken, PROMPTS[:1])


def test_every_token_routed_to_one_expert(tmp_path, smollm2_tokenizer_dir):
    """Zero router weights (every logit equal) with top-1 routing send the whole batch to one expert: one group
    holds every row and the others are empty. torch and JAX break the tie differently, so every expert is given
    expert 0's weights, and the engine must still generate HF's tokens."""
    hf_model = make_qwen3_moe(tmp_path, smollm2_tokenizer_dir, num_hidden_layers=2, norm_topk_prob=True,
                              num_experts_per_tok=1)
    [file] = tmp_path.glob("*.safetensors")
    tensors = load_file(file)
    for name in list(tensors):
        if name.endswith("mlp.gate.weight"):
            tensors[name] = np.zeros_like(tensors[name])
        elif ".mlp.experts." in name:
            expert = name.split(".mlp.experts.")[1].split(".")[0]
            tensors[name] = tensors[name.replace(f".experts.{expert}.", ".experts.0.")].copy()
    save_file(tensors, str(file), metadata={"format": "pt"})
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert engine_greedy(tmp_path, PROMPTS) == [hf_greedy(hf_model, p) for p in PROMPTS]


def test_int8_experts_generate_the_fake_quantized_models_tokens(mixed_moe, tmp_path, caplog):
    """quantization="int8" covers the experts (int8 [E, in, out] + float32 scales [E, out]): the engine generates
    HF's greedy tokens of the same checkpoint with every projection and expert replaced by its int8 round trip; the
    start-up plan's MoE line names the layout, the int8 experts and where they live."""
    from tests.models.test_int8_engine import _fake_quantized_checkpoint

    directory, _ = mixed_moe
    fake = _fake_quantized_checkpoint(directory, tmp_path / "fake")
    hf_fake = transformers.AutoModelForCausalLM.from_pretrained(fake, dtype=torch.float32).eval()
    with caplog.at_level(logging.INFO, logger="jaxpaged.runner.startup"):
        tokens = engine_greedy(directory, PROMPTS[:2], quantization="int8")
    assert tokens == [hf_greedy(hf_fake, p) for p in PROMPTS[:2]]
    plan = caplog.text
    assert "experts: 8 per layer" in plan and "top 2" in plan and ", int8;" in plan
    assert "grouped matmul: native CPU grouped matmul; all experts on the one device" in plan


def test_qwen2_moe_shared_expert_and_dense_layer_equal_hf(tmp_path, smollm2_tokenizer_dir):
    """Qwen2-MoE (qkv bias, a shared expert gated by sigmoid(x @ shared_expert_gate), a dense layer among the MoE
    ones) generates HF's greedy tokens."""
    hf_model = make_qwen3_moe(tmp_path, smollm2_tokenizer_dir, transformers.Qwen2MoeConfig, num_hidden_layers=3,
                              mlp_only_layers=[0], norm_topk_prob=False, shared_expert_intermediate_size=24)
    assert engine_greedy(tmp_path, PROMPTS) == [hf_greedy(hf_model, p) for p in PROMPTS]
