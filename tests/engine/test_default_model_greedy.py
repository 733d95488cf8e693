"""Greedy generation on the embedded SmolLM2-135M equals HF transformers generate on the same dequantized GGUF,
also through chunked prefill, after a prefix-cache hit, and after preemption and recompute (float32); in bfloat16
it follows HF's bfloat16 by vLLM's top-5 rule."""

import jax.numpy as jnp
import pytest
import torch
import transformers

from jaxpaged.config import EngineConfig
from jaxpaged.engine import LLMEngine
from jaxpaged.outputs import RequestOutput
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.default_model import default_model_path
from jaxpaged.weights.loader import load_model
from tests.conftest import hf_greedy_continuations

NUM_NEW_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea. The sea",
    "def fibonacci(n):\n    ",
    # Longer than the 32-token step budget below, so it is prefilled in several chunks.
    "In the beginning of the twentieth century, the small town by the river had only one school, one church "
    "and one bakery, and everybody knew the baker's daughter, who",
]


@pytest.fixture(scope="module")
def hf_reference() -> list[list[int]]:
    """HF transformers' own GGUF loader and greedy generate (float32; EOS suppressed by min_new_tokens)."""
    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return hf_greedy_continuations(model, tokenizer, PROMPTS, NUM_NEW_TOKENS)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    """A small pool (10 usable blocks of 16) that four requests outgrow, and a 32-token step budget."""
    config = EngineConfig.from_options(max_model_len=160, max_num_seqs=8, max_num_batched_tokens=32,
                                       num_kv_blocks=11, dtype="float32", attention_backend="xla",
                                       compilation_cache_dir="")
    return LLMEngine(load_model(None), config, warmup=False)


def run(engine: LLMEngine, prefix: str, logprobs: int | None = None) -> dict[str, RequestOutput]:
    # min_tokens suppresses EOS exactly as HF's min_new_tokens does, so both run all 32 steps on equal terms.
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS, logprobs=logprobs)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"{prefix}{i}", prompt, params)
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                results[output.request_id] = output
    return results


def test_greedy_matches_hf_through_chunks_preemption_and_prefix_hits(engine, hf_reference):
    first = run(engine, "a")
    stats = engine.get_stats()
    assert stats.num_preemptions > 0, "the pool was sized to force recompute preemption"
    for i, expected in enumerate(hf_reference):
        assert first[f"a{i}"].outputs[0].token_ids == expected, f"prompt {i}"

    second = run(engine, "b")  # the same prompts again: their full blocks are still in the prefix cache
    assert engine.get_stats().prefix_cache_hits > stats.prefix_cache_hits
    assert sum(second[f"b{i}"].num_cached_tokens for i in range(len(PROMPTS))) > 0
    for i, expected in enumerate(hf_reference):
        assert second[f"b{i}"].outputs[0].token_ids == expected, f"prompt {i} after a prefix hit"


def hf_bfloat16_top5() -> list[tuple[list[int], list[list[int]]]]:
    """HF transformers in bfloat16 on the same GGUF: per prompt, the greedy tokens and each step's top-5 ids."""
    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.bfloat16).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    results = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(  # pyright: ignore[reportAttributeAccessIssue]
                ids, max_new_tokens=NUM_NEW_TOKENS, min_new_tokens=NUM_NEW_TOKENS, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)
        tokens = out.sequences[0, ids.shape[1]:].tolist()
        results.append((tokens, [step[0].float().topk(5).indices.tolist() for step in out.logits]))
    return results


def test_bfloat16_greedy_follows_hf_bfloat16_by_the_top5_rule():
    """vLLM's check for lower precision: where the greedy tokens first differ, each side's token is in the other's
    top 5 (after that the sequences have diverged and are not compared); and the two were a near-tie for us."""
    config = EngineConfig.from_options(max_model_len=160, max_num_seqs=8, max_num_batched_tokens=32,
                                       num_kv_blocks=64, dtype="bfloat16", attention_backend="xla",
                                       compilation_cache_dir="")
    engine = LLMEngine(load_model(None), config, warmup=False)
    assert engine.runner.dtype == jnp.bfloat16
    outputs = run(engine, "bf", logprobs=5)
    num_identical = 0
    for i, (hf_tokens, hf_top5) in enumerate(hf_bfloat16_top5()):
        ours = outputs[f"bf{i}"].outputs[0]
        assert ours.logprobs is not None
        for step, (mine, theirs) in enumerate(zip(ours.token_ids, hf_tokens)):
            if mine != theirs:
                our_top5 = ours.logprobs[step]
                assert mine in hf_top5[step] and theirs in our_top5, f"prompt {i} step {step}"
                # Only near-ties flip: bfloat16 moves a logit by about 0.1 here (both sides round differently).
                gap = our_top5[mine].logprob - our_top5[theirs].logprob
                assert 0 <= gap < 0.25, f"prompt {i} step {step}: {gap}"
                break
        else:
            num_identical += 1
    assert num_identical >= 1
