"""Greedy generation on the embedded SmolLM2-135M equals HF transformers' greedy choice on the same dequantized
GGUF, also through chunked prefill, after a prefix-cache hit, and after preemption and recompute (float32); in
bfloat16 it follows HF's bfloat16 by vLLM's top-5 rule. HF's choices are read from one teacher-forced forward pass per
prompt (hf_greedy_along), not 32 decode steps (49 s of CPU for HF's float32 generate, 10 s for the forced passes)."""

import copy

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

NUM_NEW_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea. The sea",
    "def fibonacci(n):\n    ",
    # Longer than the 32-token step budget below, so it is prefilled in several chunks.
    "In the beginning of the twentieth century, the small town by the river had only one school, one church "
    "and one bakery, and everybody knew the baker's daughter, who",
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """HF's passes on one torch thread: with two, on a busy machine (the other xdist worker), the second spins while
    it waits; the module took 57.5 s of CPU with two threads and 45.5 s with one (the bfloat16 test 21.6 -> 12.1)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def hf_tokenizer():
    """HF transformers' tokenizer read from the GGUF (once for the module: the conversion takes seconds)."""
    path = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def hf_float32_model():
    """HF transformers' own GGUF loader on the embedded model, in float32 (once for the module: 14 s of CPU)."""
    path = default_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()


def hf_bfloat16_copy(hf_float32):
    """What HF's GGUF loader gives for dtype=torch.bfloat16, without reading the GGUF again (another 14 s of CPU).

    That loader dequantizes every tensor to float32 and rounds the parameters to bfloat16, keeping the rotary
    buffers (inv_freq) in float32; a copy of the float32 model with its parameters rounded the same way has equal
    parameters and buffers and gave bit-identical logits (transformers 5.24). `.to(torch.bfloat16)` would not: it
    rounds the buffers too (logits up to 0.56 apart).
    """
    model = copy.deepcopy(hf_float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.data.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    assert all(buffer.dtype == torch.float32 for buffer in model.buffers())
    return model.eval()


def hf_greedy_along(model, tokenizer, continuations: list[list[int]]) -> list[tuple[list[int], list[list[int]]]]:
    """Per prompt, HF's greedy token at each step given the prompt and our tokens before it (EOS held off, as
    min_new_tokens does), and each step's top-5 ids (EOS included).

    One forward pass per prompt over the prompt and our tokens (teacher forcing) instead of 32 decode steps: while
    HF's greedy sequence equals ours, the argmax at step s is the token HF's greedy generate picks there, so HF's
    generate gives our tokens exactly when every step's argmax is our token, and where the two first differ the
    argmax there is HF's choice.
    """
    eos = model.generation_config.eos_token_id
    eos_ids = sorted({*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id} - {None})
    results = []
    for prompt, ours in zip(PROMPTS, continuations):
        ids = torch.tensor([tokenizer.encode(prompt)])
        forced = torch.cat([ids, torch.tensor([ours[:-1]])], dim=1)
        with torch.no_grad():
            logits = model(forced).logits[0, ids.shape[1] - 1:].float()  # row s predicts token s
        top5 = logits.topk(5).indices.tolist()
        logits[:, eos_ids] = -float("inf")
        results.append((logits.argmax(-1).tolist(), top5))
    return results


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


def test_greedy_matches_hf_through_chunks_preemption_and_prefix_hits(engine, hf_tokenizer, hf_float32_model):
    first = run(engine, "a")
    stats = engine.get_stats()
    assert stats.num_preemptions > 0, "the pool was sized to force recompute preemption"
    hf_model = hf_float32_model
    # hf_greedy_along holds off the tokenizer's EOS too; HF's min_new_tokens holds off the generation config's: the
    # same token here, so the forced argmaxes are what HF's generate(min_new_tokens=32) would pick.
    eos = hf_model.generation_config.eos_token_id
    assert hf_tokenizer.eos_token_id in (eos if isinstance(eos, list) else [eos])
    ours = [list(first[f"a{i}"].outputs[0].token_ids) for i in range(len(PROMPTS))]
    hf_reference = [hf_tokens for hf_tokens, _ in hf_greedy_along(hf_model, hf_tokenizer, ours)]
    for i, expected in enumerate(hf_reference):
        assert first[f"a{i}"].outputs[0].token_ids == expected, f"prompt {i}"

    second = run(engine, "b")  # the same prompts again: their full blocks are still in the prefix cache
    assert engine.get_stats().prefix_cache_hits > stats.prefix_cache_hits
    assert sum(second[f"b{i}"].num_cached_tokens for i in range(len(PROMPTS))) > 0
    for i, expected in enumerate(hf_reference):
        assert second[f"b{i}"].outputs[0].token_ids == expected, f"prompt {i} after a prefix hit"


def test_bfloat16_greedy_follows_hf_bfloat16_by_the_top5_rule(hf_tokenizer, hf_float32_model):
    """vLLM's check for lower precision: where the greedy tokens first differ, each side's token is in the other's
    top 5 (after that the sequences have diverged and are not compared); and the two were a near-tie for us."""
    config = EngineConfig.from_options(max_model_len=160, max_num_seqs=8, max_num_batched_tokens=32,
                                       num_kv_blocks=64, dtype="bfloat16", attention_backend="xla",
                                       compilation_cache_dir="")
    engine = LLMEngine(load_model(None), config, warmup=False)
    assert engine.runner.dtype == jnp.bfloat16
    outputs = run(engine, "bf", logprobs=5)
    num_identical = 0
    ours_by_prompt = [list(outputs[f"bf{i}"].outputs[0].token_ids) for i in range(len(PROMPTS))]
    hf_bfloat16 = hf_greedy_along(hf_bfloat16_copy(hf_float32_model), hf_tokenizer, ours_by_prompt)
    for i, (hf_tokens, hf_top5) in enumerate(hf_bfloat16):
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
