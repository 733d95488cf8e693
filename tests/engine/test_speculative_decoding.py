"""Speculative decoding (n-gram): the tokens are the target model's, whatever was proposed.

Reference: the same tiny model without speculation, stepped synchronously. Greedy output must
be equal token for token; seeded sampling too (a row's draw is keyed by the tokens before it, so accepting proposals
changes no draw); unseeded sampling must draw from the same distribution (chi-square against the reference's draws);
and what the pool and the prefix cache hold afterwards must be what they hold without speculation.
"""

import collections

import numpy as np
import pytest

from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS
from tests.lazy_compile import warmed_up_as_served
from tests.speculative.same_distribution import assert_same_distribution

pytestmark = pytest.mark.xdist_group("tiny_llm")

BLOCK_SIZE = 16
# Proposals stop at 6 running requests: workloads of more switch between planning ahead (async scheduling, no
# proposals) and speculating one step after the other as requests finish.
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "disable_by_batch_size": 6}


@pytest.fixture(scope="module")
def plain_llm(tiny_model_dir):
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # it runs inside a window whose compiles are counted (the counter is per process)
        return LLM(str(tiny_model_dir), **TINY_ENGINE_OPTIONS, async_scheduling=False)


@pytest.fixture(scope="module")
def spec_llm(tiny_model_dir):
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # a test counts compiles while serving
        llm = LLM(str(tiny_model_dir), **TINY_ENGINE_OPTIONS, speculative_config=NGRAM)
    assert llm.engine.config.async_scheduling is True  # on while the batch is too large to propose
    return llm


def _prompts(lengths: list[int], seed: int = 0, repeat: int = 1) -> list[dict]:
    """Random prompts; `repeat` > 1 repeats a random run so the n-gram proposer has something to copy."""
    rng = np.random.default_rng(seed)
    prompts = []
    for length in lengths:
        run = rng.integers(10, 40000, max(1, length // repeat)).tolist()
        prompts.append({"prompt_token_ids": (run * repeat)[:length] if repeat > 1 else run})
    return prompts


def _outputs(llm, prompts, params) -> list[tuple]:
    return [(tuple(o.token_ids), o.text, o.finish_reason) for out in llm.generate(prompts, params, use_tqdm=False)
            for o in out.outputs]


def _spec_counts(llm) -> tuple[int, int]:
    stats = llm.engine.scheduler.spec_stats
    return stats.num_draft_tokens, stats.num_accepted_tokens


def test_greedy_output_equals_the_model_without_speculation_at_edge_lengths(plain_llm, spec_llm):
    # Prompts of 1 token, a block +- 1, many blocks (83 > the 64-token budget: chunked prefill), repeated runs
    # (proposals accepted) and random ones; max_tokens 1 and 2 leave no room to verify anything.
    prompts = _prompts([1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 83]) + _prompts([24, 40, 90], repeat=3)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (1, 2, 17, 16, 33, 40, 41, 30)]
    compiles = spec_llm.engine.get_stats().num_compilations
    drafted, accepted = _spec_counts(spec_llm)

    assert _outputs(spec_llm, prompts, params) == _outputs(plain_llm, prompts, params)
    new_drafted, new_accepted = _spec_counts(spec_llm)
    assert new_drafted > drafted and new_accepted > accepted  # proposals were made and kept
    assert spec_llm.engine.get_stats().num_compilations == compiles


def test_preemption_in_a_tight_pool_keeps_the_tokens(plain_llm, spec_llm):
    # 15 requests of up to 150 + 100 tokens cannot all fit the 48-block pool: requests are preempted (also while
    # few run and propose) and recomputed.
    rng = np.random.default_rng(3)
    prompts = _prompts([int(n) for n in rng.integers(100, 150, 15)], seed=3, repeat=2)
    params = [SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True)] * len(prompts)
    before = spec_llm.engine.get_stats()

    assert _outputs(spec_llm, prompts, params) == _outputs(plain_llm, prompts, params)
    assert spec_llm.engine.get_stats().num_preemptions > before.num_preemptions


def test_prefix_cache_hits_keep_the_tokens(plain_llm, spec_llm):
    prompts = _prompts([40, 57, 64], seed=4, repeat=2)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (20, 33, 16)]
    expected = _outputs(plain_llm, prompts, params)
    assert _outputs(spec_llm, prompts, params) == expected
    hits = spec_llm.engine.get_stats().prefix_cache_hits

    assert _outputs(spec_llm, prompts, params) == expected  # now from the blocks the first pass cached
    assert spec_llm.engine.get_stats().prefix_cache_hits >= hits + 32 + 48 + 48


def test_the_pool_and_the_prefix_cache_hold_what_they_hold_without_speculation(plain_llm, spec_llm):
    prompts = _prompts([20, 33, 47, 64, 70], seed=5, repeat=2)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (9, 16, 23, 31, 40)]
    state = []
    for llm in (plain_llm, spec_llm):
        assert llm.engine.reset_prefix_cache()
        _outputs(llm, prompts, params)
        kv = llm.engine.scheduler.kv_cache_manager
        pool = kv.block_pool
        listed = sorted((block.parent_key, block.token_ids) for block in pool.blocks
                        if block.parent_key is not None)
        state.append((kv.usage, pool.num_free_blocks, sorted(h for _, h in kv.cached_blocks()), listed))
    assert state[0][0] == 0.0
    assert state[1] == state[0]


def test_stop_ids_and_strings_among_accepted_proposals_end_where_they_end_without_speculation(plain_llm, spec_llm):
    prompts = _prompts([30, 45], seed=2, repeat=3)
    free = [o[0] for o in _outputs(plain_llm, prompts, [SamplingParams(temperature=0.0, max_tokens=30,
                                                                        ignore_eos=True)] * 2)]
    stop_id = free[0][9]
    stop_text = plain_llm.engine.tokenizer.decode(free[1][7:9])
    params = [SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stop_id], ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=30, stop=[stop_text], ignore_eos=True)]

    got = _outputs(spec_llm, prompts, params)
    assert got == _outputs(plain_llm, prompts, params)
    assert [finish for _, _, finish in got] == ["stop", "stop"]
    assert spec_llm.engine.scheduler.kv_cache_manager.usage == 0.0


def test_seeded_sampling_penalties_min_tokens_and_logprobs_draw_what_they_draw_without_speculation(
        plain_llm, spec_llm):
    prompts = _prompts([21, 36, 50], seed=1, repeat=3)
    params = [SamplingParams(temperature=0.8, top_k=3, seed=11, max_tokens=24, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.5, seed=12, max_tokens=24, min_tokens=10, repetition_penalty=1.3),
              SamplingParams(temperature=0.6, top_p=0.9, seed=13, max_tokens=24, n=2, frequency_penalty=0.5)]
    drafted, _ = _spec_counts(spec_llm)
    expected = plain_llm.generate(prompts, params, use_tqdm=False)
    got = spec_llm.generate(prompts, params, use_tqdm=False)

    assert [[tuple(o.token_ids) for o in out.outputs] for out in got] == \
        [[tuple(o.token_ids) for o in out.outputs] for out in expected]
    assert _spec_counts(spec_llm)[0] > drafted
    got_lp, expected_lp = got[0].outputs[0], expected[0].outputs[0]
    assert got_lp.logprobs is not None and expected_lp.logprobs is not None
    assert [sorted(entry) for entry in got_lp.logprobs] == [sorted(entry) for entry in expected_lp.logprobs]
    np.testing.assert_allclose([entry[t].logprob for entry, t in zip(got_lp.logprobs, got_lp.token_ids)],
                               [entry[t].logprob for entry, t in zip(expected_lp.logprobs, expected_lp.token_ids)],
                               rtol=1e-4, atol=1e-4)


def test_unseeded_draws_follow_the_target_distribution(plain_llm, spec_llm):
    # Two-sample chi-square over the first three tokens (top_k=2: at most 8 outcomes): speculative draws against the
    # model's own. Proposals must both be accepted and rejected along the way for the test to mean anything.
    prompt = _prompts([36], seed=9, repeat=3)
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=3, ignore_eos=True)
    drafted, accepted = _spec_counts(spec_llm)
    counts = []
    # 800 draws each. The speculative engine's five at a time: below the batch size that switches proposals off.
    # The reference's 16 (max_num_seqs) at a time: its rows draw independently of the batch, in a third of the steps.
    for llm, batch in ((plain_llm, 16), (spec_llm, 5)):
        outs = [out for _ in range(800 // batch) for out in llm.generate(prompt * batch, params, use_tqdm=False)]
        counts.append(collections.Counter(tuple(out.outputs[0].token_ids) for out in outs))
    new_drafted, new_accepted = _spec_counts(spec_llm)
    assert new_accepted > accepted and new_drafted - drafted > new_accepted - accepted  # some kept, some rejected
    assert_same_distribution(counts)
