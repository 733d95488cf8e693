"""The engine counts prompt tokens the prefix cache missed only because a varying head came first."""

import pytest

from jaxpaged.sampling.params import SamplingParams

# One worker builds the shared tiny engine (it compiles) for every test that uses it.
pytestmark = pytest.mark.xdist_group("tiny_llm")

ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def plain(start: int, n: int) -> list[int]:
    """n token ids from `start` up that are not multiples of 16 (not chunk anchors: core/prefix_advisor.py)."""
    return [t for t in range(start, start + 2 * n) if t % 16][:n]


# Eight 20-token chunks, each opened by an anchor (a multiple of 16): 160 shared tokens.
BODY = [t for k in range(8) for t in [16 * (2000 + k)] + plain(20_000 + 40 * k, 19)]


def prompt(stamp_seed: int) -> list[int]:
    """A 5-token varying "timestamp", the shared body, then a varying question opened by an anchor."""
    return plain(30_000 + 20 * stamp_seed, 5) + BODY + [16 * (2100 + stamp_seed)] + plain(40_000 + 20 * stamp_seed, 7)


def run(llm, token_ids: list[int], salt: str) -> tuple[int, int]:
    """(prefix-cache hit tokens, missed reusable tokens) that this one request added."""
    before = llm.engine.get_stats()
    llm.generate({"prompt_token_ids": token_ids, "cache_salt": salt}, ONE_TOKEN, use_tqdm=False)
    after = llm.engine.get_stats()
    return (after.prefix_cache_hits - before.prefix_cache_hits,
            after.prefix_cache_missed_reusable_tokens - before.prefix_cache_missed_reusable_tokens)


def test_timestamp_first_prompts_count_the_body_as_missed(tiny_llm):
    assert run(tiny_llm, prompt(1), "advisor-engine-a") == (0, 0)
    # The stamps differ at token 0, so the cache serves nothing; every body chunk was seen: 160 tokens missed.
    assert run(tiny_llm, prompt(2), "advisor-engine-a") == (0, 160)
    # The same content under another salt is another tenant's: never reported.
    assert run(tiny_llm, prompt(3), "advisor-engine-b") == (0, 0)


def test_the_missed_counter_stays_cumulative_across_a_prefix_cache_reset(tiny_llm):
    """A reset empties what the advisor remembers, not the counter /metrics and the bench take deltas of (an empty
    advisor once read as 0 here, so the next delta counted every earlier miss again)."""
    run(tiny_llm, prompt(4), "advisor-engine-c")
    assert run(tiny_llm, prompt(5), "advisor-engine-c") == (0, 160)
    counted = tiny_llm.engine.get_stats().prefix_cache_missed_reusable_tokens
    assert tiny_llm.engine.reset_prefix_cache()
    assert tiny_llm.engine.get_stats().prefix_cache_missed_reusable_tokens == counted
    # After the reset nothing is remembered: the body is not counted as missed again until it is seen again.
    assert run(tiny_llm, prompt(6), "advisor-engine-c") == (0, 0)
    assert run(tiny_llm, prompt(7), "advisor-engine-c") == (0, 160)
