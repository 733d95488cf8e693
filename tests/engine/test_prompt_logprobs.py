"""Prompt logprobs (vLLM's SamplingParams.prompt_logprobs) against a transformers log-softmax over the same prompt:
through chunked prefill (prompts longer than one 64-token step), and when the prompt's blocks are cached."""

import numpy as np
import pytest
import torch
import transformers

from jaxpaged.sampling.params import SamplingParams

# One worker builds the shared tiny engine (it compiles) for every test that uses it.
pytestmark = pytest.mark.xdist_group("tiny_llm")


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def reference_logprobs(hf_model, prompt: list[int]) -> np.ndarray:
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0], dim=-1).numpy()


@pytest.mark.parametrize("num_prompt_tokens", [1, 2, 15, 16, 17, 150])
def test_prompt_logprobs_equal_the_reference(tiny_llm, hf_model, num_prompt_tokens):
    rng = np.random.default_rng(num_prompt_tokens)
    prompt = rng.integers(100, 49_000, num_prompt_tokens).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=3)
    before = tiny_llm.engine.get_stats().num_compilations
    out = tiny_llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    assert tiny_llm.engine.get_stats().num_compilations == before
    reference = reference_logprobs(hf_model, prompt)
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == num_prompt_tokens
    assert out.prompt_logprobs[0] is None
    for position in range(1, num_prompt_tokens):
        entry = out.prompt_logprobs[position]
        assert entry is not None
        token_id = prompt[position]
        expected = reference[position - 1]
        np.testing.assert_allclose(entry[token_id].logprob, expected[token_id], atol=1e-4)
        # vLLM's rank; two float32 implementations may order near-ties differently: inside the band of 1e-5.
        distances = expected - expected[token_id]
        assert int((distances > 1e-5).sum()) + 1 <= entry[token_id].rank <= int((distances >= -1e-5).sum())
        assert set(np.argsort(-expected)[:3].tolist()) <= set(entry)


def test_cached_prompt_still_gets_every_logprob(tiny_llm, hf_model):
    """The prompt is in the prefix cache (asked twice): a request with prompt logprobs computes it anyway, while
    the same prompt without them is served from the cache."""
    prompt = np.random.default_rng(7).integers(100, 49_000, 70).tolist()
    plain = SamplingParams(temperature=0.0, max_tokens=2)
    tiny_llm.generate({"prompt_token_ids": prompt}, plain, use_tqdm=False)
    assert tiny_llm.generate({"prompt_token_ids": prompt}, plain, use_tqdm=False)[0].num_cached_tokens == 69
    scored = tiny_llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=2,
                                                                            prompt_logprobs=0), use_tqdm=False)[0]
    assert scored.num_cached_tokens == 0 and scored.prompt_logprobs is not None
    reference = reference_logprobs(hf_model, prompt)
    got = [entry[token].logprob for entry, token in zip(scored.prompt_logprobs[1:], prompt[1:]) if entry]
    np.testing.assert_allclose(got, [reference[i - 1, prompt[i]] for i in range(1, 70)], atol=1e-4)
    assert all(len(entry) == 1 for entry in scored.prompt_logprobs[1:] if entry)  # prompt_logprobs=0: the token


def test_prompt_logprobs_out_of_range_is_refused():
    with pytest.raises(ValueError, match="^prompt_logprobs: "):
        SamplingParams(prompt_logprobs=21)
