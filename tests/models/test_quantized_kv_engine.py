"""kv_cache_dtype "int8" / "fp8_e4m3" against an independent reference: HF transformers (torch, float32) whose
attention sees K and V fake-quantized in torch with the same scheme (a bfloat16 scale per token per KV head rounded
up from absmax / QMAX, codes rounded half to even, or cast to float8_e4m3fn). The engine's logits match it where the
unquantized model's do not, and greedy decoding through LLM gives its tokens."""

import numpy as np
import pytest
import torch
import transformers

from jaxpaged.config import EngineConfig
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.models.conftest import make_hf_checkpoint
from tests.models.test_hf_parity import BLOCK_SIZE, hf_logits, random_tokens, run_step

FORMATS = ["int8", "fp8_e4m3"]
REL_TOL = 1e-4
"""The float model's parity bound (test_hf_parity.py): the quantized engine must meet it against the fake-quantized
reference."""


def fake_quantize(x: torch.Tensor, kv_format: str) -> torch.Tensor:
    """Each [..., head_dim] row through its own scale: torch's version of the scheme, written from its description."""
    qmax = 127.0 if kv_format == "int8" else 448.0
    scale = x.abs().amax(dim=-1, keepdim=True) / qmax
    # Round the float32 scale up to a bfloat16: clear the low 16 bits after adding 0xFFFF to them (positive floats).
    bits = scale.to(torch.float32).view(torch.int32)
    scale = ((bits + 0xFFFF) & -0x10000).view(torch.float32)
    scaled = torch.where(scale > 0, x / torch.where(scale > 0, scale, 1.0), 0.0).clamp(-qmax, qmax)
    codes = torch.round(scaled) if kv_format == "int8" else scaled.to(torch.float8_e4m3fn).to(torch.float32)
    return codes * scale


def register_fake_quantized_attention(kv_format: str) -> str:
    """An HF attention implementation: eager attention over fake-quantized K and V (post-RoPE, per token per head, as
    the engine caches them); its name for attn_implementation."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        return eager_attention_forward(module, query, fake_quantize(key, kv_format), fake_quantize(value, kv_format),
                                       attention_mask, scaling, dropout, **kwargs)

    name = f"jaxpaged_fake_{kv_format}_kv"
    transformers.AttentionInterface.register(name, attention)
    # A new implementation gets no causal mask unless it names one: eager attention's own.
    transformers.AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    return name


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf-llama-kv")
    return make_hf_checkpoint("llama", directory), directory


@pytest.fixture(scope="module", params=FORMATS)
def runner_and_references(request, llama_dir):
    """(the quantized-KV runner, HF with fake-quantized K/V, HF unquantized)."""
    plain, directory = llama_dir
    config = EngineConfig.from_options(block_size=BLOCK_SIZE, num_kv_blocks=64, max_model_len=64,
                                       max_num_batched_tokens=32, max_num_seqs=16, dtype="float32",
                                       attention_backend="xla", kv_cache_dtype=request.param)
    runner = ModelRunner(load_model(str(directory)), config)
    fake = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation=register_fake_quantized_attention(request.param)).eval()
    return runner, fake, plain


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def test_prefill_over_blocks_then_decode_match_the_fake_quantized_reference(runner_and_references):
    """A 13-token prompt over 4 blocks of 4, then a chunk of 3 and a decode, on shuffled block ids."""
    runner, fake, plain = runner_and_references
    assert runner.kv_layout == "quantized" and runner.kv_cache.dtype in (np.int8, np.uint8)
    tokens = random_tokens(11, 17)
    blocks = [9, 3, 17, 8, 12]
    got = np.concatenate([run_step(runner, [(tokens[:13], 0, blocks)]), run_step(runner, [(tokens[13:16], 13, blocks)]),
                          run_step(runner, [(tokens[16:], 16, blocks)])])
    assert relative_error(got, hf_logits(fake, tokens)) < REL_TOL
    # The reference is not the float model: quantizing K/V moves the logits far past the parity bound.
    assert relative_error(got, hf_logits(plain, tokens)) > 10 * REL_TOL


@pytest.mark.parametrize("prompt_len", [1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1])
def test_edge_lengths_match_the_fake_quantized_reference(runner_and_references, prompt_len):
    runner, fake, _ = runner_and_references
    tokens = random_tokens(100 + prompt_len, prompt_len)
    assert relative_error(run_step(runner, [(tokens, 0, [5, 6])]), hf_logits(fake, tokens)) < REL_TOL


@pytest.mark.parametrize("kv_format", ["int8", pytest.param("fp8_e4m3", marks=pytest.mark.slow)])
def test_greedy_tokens_through_llm_equal_the_fake_quantized_references(llama_dir, smollm2_tokenizer_dir, kv_format):
    """Token for token through the whole engine (scheduler, 16-token blocks, chunked prefill, decode steps) against
    HF's greedy choices."""
    from jaxpaged.llm import LLM

    _, directory = llama_dir
    fake = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation=register_fake_quantized_attention(kv_format)).eval()
    prompts = [random_tokens(seed, length) for seed, length in ((1, 15), (4, 17), (5, 40))]
    # One 16-token step bucket (few compiles): the 40-token prompt is prefilled in chunks beside the others' decodes.
    llm = LLM(str(directory), tokenizer=str(smollm2_tokenizer_dir), kv_cache_dtype=kv_format, max_model_len=64,
              max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=24, dtype="float32", attention_backend="xla",
              compilation_cache_dir="")
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [output.outputs[0].token_ids for output in
           llm.generate([{"prompt_token_ids": prompt} for prompt in prompts], params, use_tqdm=False)]
    assert got == [greedy_by_full_forwards(fake, prompt, 12) for prompt in prompts]


def greedy_by_full_forwards(model, prompt: list[int], num_tokens: int) -> list[int]:
    """Greedy decoding that runs the whole sequence again for every token: no cache of HF's in the reference."""
    sequence = list(prompt)
    for _ in range(num_tokens):
        sequence.append(int(np.argmax(hf_logits(model, sequence)[-1])))
    return sequence[len(prompt):]
