"""Async scheduling: each step is planned and launched before the previous one's tokens reach the host.

The engine under test is the session's shared tiny engine with default options, which plan ahead on every
platform; the reference is the same tiny model stepped synchronously (async_scheduling=False): planning ahead must
not change a single token, a finish reason or a seeded draw, whatever finishes, stops, is aborted or preempted along
the way.
"""

import argparse

import numpy as np
import pytest

from jaxpaged.cli_options import add_engine_arguments, engine_options_from_args
from jaxpaged.config import EngineConfig
from jaxpaged.engine import resolve_async_scheduling
from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams
from jaxpaged.sampling.token_sampler import PendingSample
from tests.conftest import TINY_ENGINE_OPTIONS
from tests.lazy_compile import warmed_up_as_served

# The engine under test is the session's shared tiny engine, built on this worker.
pytestmark = pytest.mark.xdist_group("tiny_llm")

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def sync_llm(tiny_model_dir):
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # it runs inside a window whose compiles are counted (the counter is per process)
        return LLM(str(tiny_model_dir), **TINY_ENGINE_OPTIONS, async_scheduling=False)


@pytest.fixture
def async_llm(tiny_llm):
    assert tiny_llm.engine.config.async_scheduling is True  # the default, resolved on the CPU
    return tiny_llm


def _prompts(lengths: list[int], seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(10, 40000, length).tolist()} for length in lengths]


def _token_ids(llm, prompts, params) -> list[list[list[int]]]:
    return [[list(o.token_ids) for o in out.outputs] for out in llm.generate(prompts, params, use_tqdm=False)]


def test_greedy_tokens_match_the_synchronous_engine_at_edge_lengths(sync_llm, async_llm):
    # Prompts of 1 token, a block +- 1, many blocks; outputs crossing block edges; max_tokens 1 finishes at once.
    prompts = _prompts([1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 5 * BLOCK_SIZE + 3, 40])
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (1, 2, 17, 16, 33, 15)]
    before = async_llm.engine.get_stats().num_compilations

    assert _token_ids(async_llm, prompts, params) == _token_ids(sync_llm, prompts, params)
    assert [len(out[0]) for out in _token_ids(async_llm, prompts, params)] == [1, 2, 17, 16, 33, 15]
    assert async_llm.engine.get_stats().num_compilations == before


def test_seeded_sampling_draws_the_same_tokens_planned_ahead(sync_llm, async_llm):
    # The draw of a step is keyed by how many tokens the request has generated, counting the one in flight.
    prompts = _prompts([7, 20, 33], seed=1)
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=7, seed=12, max_tokens=24, min_tokens=10),
              SamplingParams(temperature=0.7, seed=13, max_tokens=24, n=2, logprobs=2)]
    expected = sync_llm.generate(prompts, params, use_tqdm=False)
    got = async_llm.generate(prompts, params, use_tqdm=False)

    assert [[list(o.token_ids) for o in out.outputs] for out in got] == \
        [[list(o.token_ids) for o in out.outputs] for out in expected]
    assert [[o.finish_reason for o in out.outputs] for out in got] == \
        [[o.finish_reason for o in out.outputs] for out in expected]
    got_logprobs = [lp[t] for lp, t in zip(got[2].outputs[0].logprobs, got[2].outputs[0].token_ids)]
    expected_logprobs = [lp[t] for lp, t in zip(expected[2].outputs[0].logprobs, expected[2].outputs[0].token_ids)]
    np.testing.assert_allclose([x.logprob for x in got_logprobs], [x.logprob for x in expected_logprobs],
                               rtol=1e-5, atol=1e-5)


def test_a_stop_token_or_string_ends_the_request_where_the_synchronous_engine_does(sync_llm, async_llm):
    prompts = _prompts([9, 18], seed=2)
    free = _token_ids(sync_llm, prompts, [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)] * 2)
    stop_id = free[0][0][6]  # the 7th token of the first prompt's continuation
    stop_text = sync_llm.engine.tokenizer.decode(free[1][0][4:6])
    params = [SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[stop_id], ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=20, stop=[stop_text], ignore_eos=True)]
    expected = sync_llm.generate(prompts, params, use_tqdm=False)
    got = async_llm.generate(prompts, params, use_tqdm=False)

    for g, e in zip(got, expected):
        assert (list(g.outputs[0].token_ids), g.outputs[0].text, g.outputs[0].finish_reason) == \
            (list(e.outputs[0].token_ids), e.outputs[0].text, e.outputs[0].finish_reason)
    assert got[0].outputs[0].finish_reason == "stop" and len(got[0].outputs[0].token_ids) <= 7
    assert async_llm.engine.scheduler.kv_cache_manager.usage == 0.0


def test_preemption_and_a_tight_pool_give_the_synchronous_tokens(sync_llm, async_llm):
    # 12 requests of up to 100 + 40 tokens cannot all fit the 48-block pool: running requests are preempted and
    # recomputed, sometimes with a token still in flight (dropped, then sampled again).
    rng = np.random.default_rng(3)
    lengths = [int(n) for n in rng.integers(30, 100, 12)]
    prompts = _prompts(lengths, seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * len(prompts)
    before = async_llm.engine.get_stats()

    assert _token_ids(async_llm, prompts, params) == _token_ids(sync_llm, prompts, params)
    after = async_llm.engine.get_stats()
    assert after.num_preemptions > before.num_preemptions
    assert after.num_compilations == before.num_compilations


def test_the_next_step_is_launched_before_the_previous_tokens_are_read(async_llm, monkeypatch):
    engine = async_llm.engine
    runner = engine.runner
    events: list[str] = []
    forward, result = runner.forward, PendingSample.result

    def logged_forward(output):
        events.append("launch")
        return forward(output)

    def logged_result(pending):
        events.append("result")
        return result(pending)

    monkeypatch.setattr(runner, "forward", logged_forward)
    monkeypatch.setattr(PendingSample, "result", logged_result)
    _token_ids(async_llm, _prompts([12, 30]), [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 2)
    monkeypatch.undo()
    # Steady state: launch N+1, then read N; never two reads in a row while requests run.
    assert events[:3] == ["launch", "launch", "result"]
    assert "result, result" not in ", ".join(events[:-2])
    assert engine.loop.in_flight is None or not engine.has_unfinished_requests()


ORDER_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                 "count": {"type": "integer"}}, "required": ["name", "count"]}


def test_penalty_grammar_and_min_tokens_requests_are_planned_ahead_and_sample_after_their_tokens(
        sync_llm, async_llm, monkeypatch):
    # Their next token depends on the last one on the host (a bitmask, output counts, the min_tokens gate): the
    # model of the step planned ahead runs at once, its sampler once the step before has applied its tokens.
    prompts = _prompts([10, 25, 17, 6, 12], seed=4)
    params = [SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3, presence_penalty=0.4,
                             ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=21, max_tokens=30, frequency_penalty=0.5, n=2,
                             structured_outputs=StructuredOutputsParams(json=ORDER_SCHEMA)),
              SamplingParams(temperature=0.0, max_tokens=8,
                             structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
              SamplingParams(temperature=1.0, seed=5, max_tokens=10, min_tokens=6, logprobs=1)]
    expected = sync_llm.generate(prompts, params, use_tqdm=False)
    engine = async_llm.engine
    runner = engine.runner
    events: list[str] = []
    forward, sample, result = runner.forward, runner.sample, PendingSample.result
    monkeypatch.setattr(runner, "forward", lambda output: events.append("forward") or forward(output))
    monkeypatch.setattr(runner, "sample", lambda step: events.append("sample") or sample(step))
    monkeypatch.setattr(PendingSample, "result", lambda pending: events.append("result") or result(pending))
    got = async_llm.generate(prompts, params, use_tqdm=False)
    monkeypatch.undo()

    for g, e in zip(got, expected):
        assert [(list(o.token_ids), o.text, o.finish_reason) for o in g.outputs] == \
            [(list(o.token_ids), o.text, o.finish_reason) for o in e.outputs]
    assert got[3].outputs[0].text in ("yes", "no")
    # Planned ahead: step N+1's model is dispatched before step N's tokens are read, its sampler after.
    assert events[:5] == ["forward", "sample", "forward", "result", "sample"]
    assert "result, result" not in ", ".join(events[:-2])
    assert engine.scheduler.kv_cache_manager.usage == 0.0


def test_an_abort_with_a_step_in_flight_loses_nothing_else(sync_llm, async_llm):
    engine = async_llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    keep, drop = _prompts([14, 22], seed=5)
    engine.add_request("keep", keep, params)
    engine.add_request("drop", drop, params)
    outputs = {}
    for _ in range(4):
        for out in engine.step():
            outputs[out.request_id] = out
    assert engine.loop.in_flight is not None
    engine.abort_request("drop")
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out

    assert list(outputs["keep"].outputs[0].token_ids) == _token_ids(sync_llm, [keep], [params])[0][0]
    assert outputs["keep"].finished and not outputs["drop"].finished
    assert engine.scheduler.kv_cache_manager.usage == 0.0


def test_the_flag_reaches_the_config_the_default_resolves_and_bad_combinations_are_refused(tiny_model_dir, tiny_llm):
    from jaxpaged.llm import LLM

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    for flags, value in ([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False):
        options = engine_options_from_args(parser.parse_args(flags))
        assert EngineConfig.from_options(**options).async_scheduling is value
    with pytest.raises(ValueError, match="async_scheduling: must be a bool or None"):
        EngineConfig.from_options(async_scheduling="yes")
    with pytest.raises(ValueError, match="async_scheduling: not supported with the KV tiers"):
        LLM(str(tiny_model_dir), **TINY_ENGINE_OPTIONS, async_scheduling=True, kv_offload_memory="16MiB")
    # The default (None): on for every platform unless the KV tiers are on (LLMEngine resolves it first thing, so
    # the tests' engines plan ahead unless they ask not to).
    tiers = EngineConfig.from_options(kv_offload_memory="16MiB")
    assert [resolve_async_scheduling(EngineConfig(), platform) for platform in ("tpu", "gpu", "cpu")] == \
        [True, True, True]
    assert not resolve_async_scheduling(tiers, "tpu") and not resolve_async_scheduling(tiers, "cpu")
    assert not resolve_async_scheduling(EngineConfig.from_options(async_scheduling=False), "cpu")
    assert tiny_llm.engine.config.async_scheduling is True  # the shared engine, default options


def test_the_later_samples_of_n_share_the_first_one_s_prompt_blocks_as_in_step(sync_llm, async_llm):
    # They wait until the first sample's prompt step is applied (its blocks hashed), not merely planned.
    prompts = _prompts([40], seed=6)
    params = [SamplingParams(temperature=0.8, seed=3, max_tokens=6, n=3, ignore_eos=True)]
    hits = []
    for llm in (sync_llm, async_llm):
        llm.reset_prefix_cache()
        before = llm.engine.get_stats().prefix_cache_hits
        outputs = _token_ids(llm, prompts, params)
        hits.append((llm.engine.get_stats().prefix_cache_hits - before, outputs))
    assert hits[1] == hits[0]
    assert hits[0][0] >= 2 * 32  # samples 2 and 3 each hit the prompt's two full blocks
