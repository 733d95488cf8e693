"""YaRN RoPE scaling: the inverse frequencies and attention factor transformers computes, and a tiny Qwen3 with
YaRN generating HF's greedy tokens past its original context length."""

import shutil

import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from jaxpaged.config import EngineConfig
from jaxpaged.llm import LLM
from jaxpaged.models.registry import read_model_config
from jaxpaged.models.yarn import YarnScaling, yarn_inverse_frequencies
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.models.test_hf_parity import BLOCK_SIZE, assert_close, hf_greedy, hf_logits, run_step

ORIGINAL_LENGTH = 64
QWEN3: dict = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
YARN: dict = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL_LENGTH,
              "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 10000.0}
NUM_NEW_TOKENS = 8

# Variants of the parameters each path reads: defaults, gpt-oss's untruncated ramp, DeepSeek's mscale pair, a given
# attention factor, a missing factor (max_position_embeddings over the original length).
VARIANTS = {
    "qwen3": YARN,
    "untruncated": YARN | {"truncate": False, "beta_fast": 16.0, "rope_theta": 150000.0},
    "mscale": YARN | {"mscale": 1.0, "mscale_all_dim": 0.707},
    "attention-factor": YARN | {"attention_factor": 1.25},
    "no-factor": {k: v for k, v in YARN.items() if k != "factor"} | {"factor": None},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_frequencies_and_attention_factor_match_transformers(variant):
    """read_model_config + yarn_inverse_frequencies give transformers' _compute_yarn_parameters results."""
    rope = VARIANTS[variant]
    hf_config = transformers.Qwen3Config(**QWEN3, rope_parameters=dict(rope))
    expected_freq, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config)
    cfg = read_model_config(dict(QWEN3, architectures=["Qwen3ForCausalLM"], rope_scaling=dict(rope)))
    assert isinstance(cfg.rope_scaling, YarnScaling)
    np.testing.assert_allclose(yarn_inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling),
                               expected_freq.numpy(), rtol=1e-6)
    assert cfg.rope_attention_scale == pytest.approx(expected_factor, rel=1e-12)
    assert expected_factor != 1.0


def test_yarn_without_its_original_length_is_refused():
    """A yarn rope_scaling that lacks original_max_position_embeddings names the missing field."""
    rope = {k: v for k, v in YARN.items() if k != "original_max_position_embeddings"}
    with pytest.raises(KeyError, match="original_max_position_embeddings"):
        read_model_config(dict(QWEN3, architectures=["Qwen3ForCausalLM"], rope_scaling=rope))


@pytest.fixture(scope="module")
def yarn_qwen3(tmp_path_factory, smollm2_tokenizer_dir):
    """A seeded random tiny Qwen3 with YaRN (factor 4 over 64 positions), saved with a tokenizer; the HF model."""
    directory = tmp_path_factory.mktemp("qwen3-yarn")
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3, rope_parameters=dict(YARN))).eval()
    with torch.no_grad():  # HF's unit norms: random ones make a misplaced q/k norm observable
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_tokenizer_dir / name, directory / name)
    return model, directory


def test_yarn_qwen3_greedy_matches_hf_past_the_original_length(yarn_qwen3):
    """Prompts of 100 and 150 tokens (over the original 64) generate HF's greedy tokens (float32)."""
    model, directory = yarn_qwen3
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 49152, n).tolist() for n in (100, 150)]
    expected = hf_greedy(model, prompts, NUM_NEW_TOKENS)
    llm = LLM(str(directory), dtype="float32", attention_backend="xla", max_model_len=256, max_num_seqs=4,
              max_num_batched_tokens=64, compilation_cache_dir="")
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected


def test_yarn_qwen3_logits_match_hf_past_the_original_length(yarn_qwen3):
    """Every position's logits of a 120-token prompt (over the original 64) match HF's, attention factor included."""
    model, directory = yarn_qwen3
    config = EngineConfig.from_options(block_size=BLOCK_SIZE, num_kv_blocks=80, max_model_len=256,
                                       max_num_batched_tokens=128, max_num_seqs=128, dtype="float32",
                                       attention_backend="xla")
    runner = ModelRunner(load_model(str(directory)), config)
    tokens = np.random.default_rng(11).integers(3, 49152, 120).tolist()
    got = run_step(runner, [(tokens, 0, list(range(1, 31)))])
    assert_close(got, hf_logits(model, tokens))
