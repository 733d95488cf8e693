"""bf16 safetensors load memory-mapped in their own dtype: no float32 host copy, and the engine still matches HF."""

import json
import pathlib
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.converted_store import save_converted
from jaxpaged.weights.loader import load_model
from tests.conftest import TINY_LLAMA, hf_greedy_continuations, save_tiny_llama
from tests.weights.load_peak import measure_load_peak

# ~51M parameters, nearly all in the stacked layers (~100 MB in bf16): a small vocabulary keeps the lazily mapped
# embedding and lm_head from hiding a regression in the layer stacking.
MEMORY_LLAMA: dict[str, Any] = dict(vocab_size=1024, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                    num_attention_heads=8, num_key_value_heads=8, head_dim=64, tie_word_embeddings=False)
MAX_GROWTH = 1.2  # peak host memory growth while loading, as a multiple of the safetensors size

GREEDY_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
NUM_NEW_TOKENS = 12


def save_bf16(directory: pathlib.Path) -> None:
    """Rewrite a float32 safetensors checkpoint in bfloat16, as bf16 models are published."""
    file = directory / "model.safetensors"
    tensors = safetensors.torch.load_file(file)
    safetensors.torch.save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, file,
                                metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))


@pytest.fixture(scope="module")
def memory_model_dir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("bf16-memory")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**MEMORY_LLAMA)).bfloat16()
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_bf16_dir(tmp_path_factory, smollm2_tokenizer_dir) -> pathlib.Path:
    directory = save_tiny_llama(tmp_path_factory.mktemp("tiny-bf16"), smollm2_tokenizer_dir, TINY_LLAMA)
    save_bf16(directory)
    return directory


def test_peak_host_memory_stays_near_the_checkpoint_size(memory_model_dir):
    """A float32 copy would double the growth, and so would keeping every mapped page resident while stacking."""
    file_size = sum(f.stat().st_size for f in memory_model_dir.glob("*.safetensors"))
    report = measure_load_peak("from jaxpaged.weights.loader import load_model", "loaded = load_model(sys.argv[1])",
                               '{"dtypes": sorted({str(v.dtype) for v in loaded.params.values()})}', memory_model_dir)
    assert report["dtypes"] == ["bfloat16"]
    growth = report["growth_bytes"] / file_size
    assert growth <= MAX_GROWTH, f"loading grew host memory by {growth:.2f}x the {file_size / 2**20:.0f} MiB checkpoint"


def test_bf16_params_keep_their_dtype_and_values(tiny_bf16_dir):
    loaded = load_model(str(tiny_bf16_dir))
    assert {str(v.dtype) for v in loaded.params.values()} == {"bfloat16"}
    reference = safetensors.torch.load_file(tiny_bf16_dir / "model.safetensors")
    q_proj = reference["model.layers.1.self_attn.q_proj.weight"].float().numpy()
    np.testing.assert_array_equal(loaded.params["layers.q_proj"][1].astype(np.float32), q_proj.T)
    embed = reference["model.embed_tokens.weight"].float().numpy()
    np.testing.assert_array_equal(loaded.params["embed"].astype(np.float32), embed)


def test_converted_checkpoint_keeps_bf16(tiny_bf16_dir, tmp_path):
    """`jaxpaged convert` saves what load_model returns: bf16 arrays, some of them read-only mapped views."""
    loaded = load_model(str(tiny_bf16_dir))
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(loaded.tokenizer_dir))
    save_converted(tmp_path / "converted", loaded.hf_config, loaded.params, tokenizer, loaded.name)
    converted = load_model(str(tmp_path / "converted"))
    for name, value in loaded.params.items():
        assert converted.params[name].dtype == value.dtype, name
        np.testing.assert_array_equal(converted.params[name], value)


@pytest.fixture(scope="module")
def hf_greedy(tiny_bf16_dir) -> list[list[int]]:
    """HF transformers' greedy generate on the bf16 checkpoint upcast to float32 (EOS held off by min_new_tokens)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_bf16_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bf16_dir)
    return hf_greedy_continuations(model, tokenizer, GREEDY_PROMPTS, NUM_NEW_TOKENS)


def test_float32_engine_on_bf16_checkpoint_matches_hf_greedy(tiny_bf16_dir, hf_greedy):
    llm = LLM(str(tiny_bf16_dir), dtype="float32", attention_backend="xla", max_model_len=128, max_num_seqs=4,
              max_num_batched_tokens=32, compilation_cache_dir="")
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
    outputs = llm.generate(GREEDY_PROMPTS, params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy
