"""Draft-model speculative decoding in the engine: the tokens are the target model's, whatever the draft proposed.

Reference: the same tiny target without speculation, stepped synchronously. The target's weights are drawn with a
larger spread than the shared tiny model's (initializer_range 0.1), so its layers decide its greedy tokens: a draft
of its first layer then proposes some tokens the target keeps and some it rejects. A draft that is the target itself
must have every proposal kept (a sharp check of the draft's K/V, catch-up and rollback).
"""

import collections
import json
import pathlib
import shutil

import numpy as np
import pytest

from benchmarks.speculative.truncated_draft import write_truncated_draft
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA, save_tiny_llama
from tests.lazy_compile import warmed_up_as_served
from tests.speculative.same_distribution import assert_same_distribution

pytestmark = pytest.mark.xdist_group("draft_model")

BLOCK_SIZE = 16
K = 3
TARGET = {**TINY_LLAMA, "initializer_range": 0.1}


def _draft_config(path: pathlib.Path) -> dict:
    # Proposals stop at 6 running requests (above, the engine plans ahead without them).
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": K, "disable_by_batch_size": 6}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, smollm2_tokenizer_dir) -> pathlib.Path:
    return save_tiny_llama(tmp_path_factory.mktemp("draft-target"), smollm2_tokenizer_dir, TARGET)


UNMETERED = {"speculative_measure_cost": False}
"""These engines propose whenever acceptance allows, as the tests count proposals; the step-cost meter's own tests
are tests/speculative/test_step_cost.py (and test_the_metered_default_keeps_the_tokens below)."""


@pytest.fixture(scope="module")
def plain_llm(target_dir):
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # it runs inside a window whose compiles are counted (the counter is per process)
        return LLM(str(target_dir), **TINY_ENGINE_OPTIONS, async_scheduling=False)


@pytest.fixture(scope="module")
def self_draft_llm(target_dir):
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # a test counts compiles while serving
        return LLM(str(target_dir), **TINY_ENGINE_OPTIONS, speculative_config=_draft_config(target_dir),
                   **UNMETERED)


@pytest.fixture(scope="module")
def truncated_llm(target_dir, tmp_path_factory):
    from jaxpaged.llm import LLM

    draft = write_truncated_draft(str(target_dir), 1, tmp_path_factory.mktemp("draft-1-layer") / "draft")
    with warmed_up_as_served():  # a test counts compiles while serving
        return LLM(str(target_dir), **TINY_ENGINE_OPTIONS, speculative_config=_draft_config(draft), **UNMETERED)


def _prompts(lengths: list[int], seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(10, 40000, length).tolist()} for length in lengths]


def _outputs(llm, prompts, params) -> list[tuple]:
    return [(tuple(o.token_ids), o.text, o.finish_reason) for out in llm.generate(prompts, params, use_tqdm=False)
            for o in out.outputs]


def _spec_counts(llm) -> tuple[int, int, int]:
    stats = llm.engine.scheduler.spec_stats
    return stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens


EDGE_PROMPTS = [1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 83]  # 83 > the 64-token budget: chunked prefill
EDGE_MAX_TOKENS = (1, 2, 17, 40, 33)


def test_a_draft_that_is_the_target_has_every_proposal_kept(plain_llm, self_draft_llm):
    prompts = _prompts(EDGE_PROMPTS)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in EDGE_MAX_TOKENS]
    stats = self_draft_llm.engine.scheduler.spec_stats
    compiles = self_draft_llm.engine.get_stats().num_compilations
    drafts, drafted, accepted = _spec_counts(self_draft_llm)
    full_rows = stats.accepted_per_position[K - 1] if len(stats.accepted_per_position) >= K else 0

    assert _outputs(self_draft_llm, prompts, params) == _outputs(plain_llm, prompts, params)
    new_drafts, new_drafted, new_accepted = _spec_counts(self_draft_llm)
    assert new_drafted - drafted > 20 and new_accepted - accepted == new_drafted - drafted
    # Mean accepted length k: every row verifies k proposals and keeps them all, but a request's last row, whose
    # proposals max_tokens caps.
    assert stats.accepted_per_position[K - 1] - full_rows >= new_drafts - drafts - len(prompts)
    assert self_draft_llm.engine.get_stats().num_compilations == compiles


def test_greedy_output_with_a_truncated_draft_equals_the_target_at_edge_lengths(plain_llm, truncated_llm):
    prompts = _prompts(EDGE_PROMPTS, seed=1)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in EDGE_MAX_TOKENS]
    compiles = truncated_llm.engine.get_stats().num_compilations
    _, drafted, accepted = _spec_counts(truncated_llm)

    assert _outputs(truncated_llm, prompts, params) == _outputs(plain_llm, prompts, params)
    _, new_drafted, new_accepted = _spec_counts(truncated_llm)
    assert 0 < new_accepted - accepted < new_drafted - drafted  # some proposals kept, some rejected
    assert truncated_llm.engine.get_stats().num_compilations == compiles


def test_the_metered_default_keeps_the_tokens(plain_llm, target_dir):
    """With the step-cost meter on (the default), whichever steps it lets propose, the tokens are the target's; the
    meter has measured the steps it saw (per emitted token, with proposals at least)."""
    from jaxpaged.llm import LLM

    metered = LLM(str(target_dir), **TINY_ENGINE_OPTIONS, speculative_config=_draft_config(target_dir))
    speculator = metered.engine.speculator
    assert speculator is not None and speculator.meter is not None
    meter = speculator.meter
    prompts = _prompts([1, 17, 40], seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 3
    assert _outputs(metered, prompts, params) == _outputs(plain_llm, prompts, params)
    assert any(cost.with_proposals for cost in meter.classes.values())


def test_preemption_in_a_tight_pool_keeps_the_tokens(plain_llm, truncated_llm):
    # 5 requests (few enough to propose) of up to 80 + 170 tokens cannot all fit the 48-block pool as they grow:
    # requests are preempted while proposing and recomputed; the draft drops its K/V for them and catches up again.
    rng = np.random.default_rng(3)
    prompts = _prompts([int(n) for n in rng.integers(60, 80, 5)], seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=170, ignore_eos=True)] * len(prompts)
    before = truncated_llm.engine.get_stats()
    _, drafted, _ = _spec_counts(truncated_llm)

    assert _outputs(truncated_llm, prompts, params) == _outputs(plain_llm, prompts, params)
    assert truncated_llm.engine.get_stats().num_preemptions > before.num_preemptions
    assert _spec_counts(truncated_llm)[1] > drafted


def test_prefix_cache_hits_keep_the_tokens(plain_llm, truncated_llm):
    prompts = _prompts([40, 57, 64], seed=4)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (20, 33, 16)]
    expected = _outputs(plain_llm, prompts, params)
    assert _outputs(truncated_llm, prompts, params) == expected
    hits = truncated_llm.engine.get_stats().prefix_cache_hits

    assert _outputs(truncated_llm, prompts, params) == expected  # the target's blocks hit; the draft recomputes
    assert truncated_llm.engine.get_stats().prefix_cache_hits >= hits + 32 + 48 + 48


def test_the_pools_hold_what_they_hold_without_speculation(plain_llm, self_draft_llm, truncated_llm):
    prompts = _prompts([20, 33, 47, 64, 70], seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (9, 16, 23, 31, 40)]
    state = []
    for llm in (plain_llm, self_draft_llm, truncated_llm):
        assert llm.engine.reset_prefix_cache()
        _outputs(llm, prompts, params)
        kv = llm.engine.scheduler.kv_cache_manager
        pool = kv.block_pool
        listed = sorted((block.parent_key, block.token_ids) for block in pool.blocks if block.parent_key is not None)
        state.append((kv.usage, pool.num_free_blocks, sorted(h for _, h in kv.cached_blocks()), listed))
    assert state[0][0] == 0.0
    assert state[1] == state[0] and state[2] == state[0]
    for llm in (self_draft_llm, truncated_llm):  # every draft block back in the draft's pool
        proposer = llm.engine.speculator.proposer
        assert proposer.sequences == {} and proposer.pool.num_free_blocks == proposer.steps.shape.num_kv_blocks - 1


def test_seeded_sampling_draws_what_it_draws_without_speculation(plain_llm, truncated_llm):
    prompts = _prompts([21, 36, 50], seed=1)
    params = [SamplingParams(temperature=0.8, top_k=3, seed=11, max_tokens=24, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.5, seed=12, max_tokens=24, min_tokens=10, repetition_penalty=1.3),
              SamplingParams(temperature=0.6, top_p=0.9, seed=13, max_tokens=24, n=2, frequency_penalty=0.5)]
    _, drafted, _ = _spec_counts(truncated_llm)
    expected = [[tuple(o.token_ids) for o in out.outputs] for out in plain_llm.generate(prompts, params,
                                                                                         use_tqdm=False)]
    for _ in range(2):  # and again: the same draws
        got = truncated_llm.generate(prompts, params, use_tqdm=False)
        assert [[tuple(o.token_ids) for o in out.outputs] for out in got] == expected
    assert _spec_counts(truncated_llm)[1] > drafted


def test_unseeded_draws_follow_the_target_distribution(plain_llm, self_draft_llm):
    # Two-sample chi-square over the first three tokens (top_k=2: at most 8 outcomes): draws with the draft's
    # proposals verified against the target's own. The draft is the target: its greedy proposal is the likelier of
    # the two tokens, kept when the draw equals it and rejected when not, so both happen along the way.
    prompt = _prompts([36], seed=9)
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=3, ignore_eos=True)
    _, drafted, accepted = _spec_counts(self_draft_llm)
    counts = []
    # 300 draws each: the speculative engine's five at a time (below disable_by_batch_size); the reference's 15 at a
    # time (its rows draw independently of the batch), in a third of the steps.
    for llm, batch in ((plain_llm, 15), (self_draft_llm, 5)):
        outs = [out for _ in range(300 // batch) for out in llm.generate(prompt * batch, params, use_tqdm=False)]
        counts.append(collections.Counter(tuple(out.outputs[0].token_ids) for out in outs))
    _, new_drafted, new_accepted = _spec_counts(self_draft_llm)
    assert new_accepted > accepted and new_drafted - drafted > new_accepted - accepted
    assert_same_distribution(counts)


# ---- bad input at start-up -------------------------------------------------------------------------------------


def _start(target_dir: pathlib.Path, draft: object, **options) -> None:
    from jaxpaged.llm import LLM

    LLM(str(target_dir), **{**TINY_ENGINE_OPTIONS, **options}, speculative_config={"method": "draft_model",
                                                                                   "model": str(draft)})


def test_a_draft_with_another_vocabulary_is_refused(target_dir, tmp_path, smollm2_tokenizer_dir):
    draft = save_tiny_llama(tmp_path / "draft", smollm2_tokenizer_dir, {**TARGET, "vocab_size": 49280})
    with pytest.raises(ValueError, match="^speculative_model: .*vocabulary of 49280 tokens"):
        _start(target_dir, draft)


def test_a_draft_with_another_tokenizer_is_refused(target_dir, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(target_dir, draft)
    tokenizer = json.loads((draft / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = "hello", "world"
    vocab[first], vocab[second] = vocab[second], vocab[first]  # same size, two ids mean other text
    (draft / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match="^speculative_model: .*another tokenizer"):
        _start(target_dir, draft)


def test_a_draft_with_a_shorter_context_than_max_model_len_is_refused(target_dir, tmp_path, smollm2_tokenizer_dir):
    draft = save_tiny_llama(tmp_path / "draft", smollm2_tokenizer_dir, {**TARGET, "max_position_embeddings": 128})
    with pytest.raises(ValueError, match="^speculative_model: .*128 positions, fewer than max_model_len \\(256\\)"):
        _start(target_dir, draft)


def test_a_missing_draft_is_refused(target_dir, tmp_path):
    with pytest.raises(ValueError, match="^speculative_model: .*nothing-here.* does not exist"):
        _start(target_dir, tmp_path / "nothing-here")
