"""Prompts of random token ids and completion comparisons shared by the prefix-cache tests (token-granular hits,
KV tiers): a wrong K/V slot moves the log-probabilities even where the tiny random model's argmax hides it."""

import random

import pytest

from jaxpaged.sampling.params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=1)


def token_ids(seed: int, n: int) -> list[int]:
    """n random ids of the tiny model's vocabulary, above the special tokens."""
    rng = random.Random(seed)
    return [rng.randrange(100, 49_000) for _ in range(n)]


def ask(llm, prompt: list[int], salt=None, params=GREEDY):
    """One request through LLM.generate, with a cache_salt if given; its RequestOutput."""
    prompt_input = {"prompt_token_ids": prompt} if salt is None else {"prompt_token_ids": prompt, "cache_salt": salt}
    return llm.generate(prompt_input, params, use_tqdm=False)[0]


def same_completion(got, want) -> bool:
    """Equal tokens, and log-probabilities within float32 noise (the random tiny model's argmax alone would hide
    a few wrong K/V slots among hundreds)."""
    got, want = got.outputs[0], want.outputs[0]
    return got.token_ids == want.token_ids and got.cumulative_logprob == pytest.approx(want.cumulative_logprob,
                                                                                       abs=1e-4)
