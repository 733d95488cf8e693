"""Token-granular prefix hits end to end through LLM: the helpdesk table of issue 15 on 16-token pages, chat turns
that reuse the previous answer, and a randomized workload (with preemption) token-identical to caching off."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxpaged.sampling.params import SamplingParams
from tests.prefix_prompts import GREEDY, ask, same_completion, token_ids

# One worker builds this module's engines (each compiles) for all of its tests.
pytestmark = pytest.mark.xdist_group("token_granular_prefix")

HELPDESK_OPTIONS = dict(max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=256, num_kv_blocks=160,
                        block_size=16, dtype="float32", attention_backend="xla", compilation_cache_dir="")
# A pool of 15 usable 4-token blocks for prompts up to 40 tokens: three long requests at once must preempt.
SMALL_POOL_OPTIONS = dict(max_model_len=48, max_num_seqs=4, max_num_batched_tokens=32, num_kv_blocks=16,
                          block_size=4, dtype="float32", attention_backend="xla", compilation_cache_dir="")


@pytest.fixture(scope="module")
def helpdesk_llm(tiny_model_dir):
    from jaxpaged.llm import LLM

    return LLM(str(tiny_model_dir), **HELPDESK_OPTIONS)


def missed(llm) -> int:
    return llm.engine.get_stats().prefix_cache_missed_reusable_tokens


def test_helpdesk_table(helpdesk_llm):
    llm = helpdesk_llm
    assert llm.reset_prefix_cache()
    system = token_ids(1, 1000)
    questions = [token_ids(seed, 12) for seed in (2, 3, 4)]
    alone = []
    for question in questions:  # references, each computed from scratch
        assert llm.reset_prefix_cache()
        alone.append(ask(llm, system + question))
    assert llm.reset_prefix_cache()

    first = ask(llm, system + questions[0])
    assert first.num_cached_tokens == 0
    # A 1,000-token shared prefix then different questions: all 1,000 tokens, not the 992 of whole blocks.
    for question, expected in zip(questions[1:], alone[1:]):
        out = ask(llm, system + question)
        assert out.num_cached_tokens == 1000
        assert same_completion(out, expected)
    assert same_completion(first, alone[0])

    # The identical prompt again: all but its last token.
    again = ask(llm, system + questions[1])
    assert again.num_cached_tokens == 1011 and same_completion(again, alone[1])

    # A timestamp first: nothing reusable by the cache, and the advisor counts the shared part as missed.
    before = missed(llm)
    stamped = ask(llm, token_ids(5, 6) + system + questions[2])
    assert stamped.num_cached_tokens == 0
    assert missed(llm) - before >= 900

    # Another tenant's salt: no hit in any form, and nothing reported across salts.
    before = missed(llm)
    salted = ask(llm, system + questions[1], salt="other-tenant")
    assert salted.num_cached_tokens == 0 and same_completion(salted, alone[1])
    assert missed(llm) == before

    # After a reset nothing is cached, so nothing counts as missed either (the advisor forgets with the cache).
    assert llm.reset_prefix_cache()
    ask(llm, token_ids(6, 6) + system + questions[0])
    assert missed(llm) == before


@pytest.mark.parametrize("turn1_len", [1, 15, 16, 17, 40])
def test_turn_two_reuses_turn_one_prompt_and_answer(helpdesk_llm, turn1_len):
    """Generated tokens are cacheable: turn 2 (turn 1 + its answer + a new message) hits everything turn 1 computed,
    i.e. all but turn 1's last sampled token (whose K/V no step computed)."""
    llm = helpdesk_llm
    assert llm.reset_prefix_cache()
    turn1 = token_ids(100 + turn1_len, turn1_len)
    answer = ask(llm, turn1, params=SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True))
    answer_ids = answer.outputs[0].token_ids
    turn2 = turn1 + answer_ids + token_ids(200 + turn1_len, 5)
    second = ask(llm, turn2)
    assert second.num_cached_tokens == turn1_len + len(answer_ids) - 1
    assert llm.reset_prefix_cache()
    assert same_completion(second, ask(llm, turn2))


@pytest.fixture(scope="module")
def small_pool_llms(tiny_model_dir):
    """(token-granular prefix caching, prefix caching off) over the same small pool."""
    from jaxpaged.llm import LLM

    return (LLM(str(tiny_model_dir), **SMALL_POOL_OPTIONS),
            LLM(str(tiny_model_dir), enable_prefix_caching=False, **SMALL_POOL_OPTIONS))


SEGMENTS = [token_ids(300 + k, n) for k, n in enumerate([1, 3, 4, 5, 7, 9])]


@st.composite
def shared_and_diverging_prompts(draw):
    """Prompts stitched from a few shared segments, so they share prefixes at every offset and diverge mid-block."""
    prompts = []
    for _ in range(draw(st.integers(2, 5))):
        parts = draw(st.lists(st.sampled_from(range(len(SEGMENTS))), min_size=1, max_size=5))
        prompt = [t for k in parts for t in SEGMENTS[k]][:40]
        prompts.append(prompt + token_ids(draw(st.integers(0, 3)), draw(st.integers(0, 2))))
    return prompts


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(shared_and_diverging_prompts(), min_size=1, max_size=3), max_tokens=st.integers(1, 6))
def test_copy_on_write_hits_are_token_identical_to_caching_off(small_pool_llms, batches, max_tokens):
    cached_llm, reference_llm = small_pool_llms
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    for prompts in batches:
        inputs = [{"prompt_token_ids": p} for p in prompts]
        got = cached_llm.generate(inputs, params, use_tqdm=False)
        want = reference_llm.generate(inputs, params, use_tqdm=False)
        assert all(same_completion(g, w) for g, w in zip(got, want))


def test_copies_and_preemption_in_one_batch_match_caching_off(small_pool_llms):
    """A fixed case of what the randomized run mixes: three requests copy 2 tokens of a cached block (hits that are
    not whole blocks), then outgrow the pool while decoding (preemption and recompute, hitting the cache again)."""
    cached_llm, reference_llm = small_pool_llms
    shared = SEGMENTS[4] + SEGMENTS[5]  # 16 tokens: 4 full blocks
    cached_llm.generate({"prompt_token_ids": shared + [101]}, GREEDY, use_tqdm=False)
    prompts = [{"prompt_token_ids": shared[:14] + token_ids(500 + k, 12)} for k in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
    before = cached_llm.engine.get_stats().num_preemptions
    got = cached_llm.generate(prompts, params, use_tqdm=False)
    want = reference_llm.generate(prompts, params, use_tqdm=False)
    assert cached_llm.engine.get_stats().num_preemptions > before
    assert got[0].num_cached_tokens == 14  # 3 whole blocks and 2 copied tokens
    assert all(same_completion(g, w) for g, w in zip(got, want))
