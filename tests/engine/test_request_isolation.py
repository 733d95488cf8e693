"""Per-request failure isolation on the tiny engine: a fault injected into one request's host work (its sampling
row, its detokenizer) fails that request alone, frees its blocks, and leaves a concurrent request's tokens exactly
as they are when it runs alone; the offline API raises RequestFailedError naming the request."""

import pytest

from jaxpaged.outputs import RequestFailedError, RequestOutput
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.sampling.token_sampler import TokenSampler

# The engine under test is the session's shared tiny engine, built on this worker.
pytestmark = pytest.mark.xdist_group("tiny_llm")

HEALTHY_PROMPT = "The healthy request keeps sampling"
HEALTHY = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=20, ignore_eos=True)
DOOMED = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, seed=424242)


def _run(engine) -> dict[str, RequestOutput]:
    """Steps the engine until idle; each request's last output."""
    finals: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            finals[output.request_id] = output
    return finals


def _assert_engine_idle(engine) -> None:
    stats = engine.get_stats()
    assert not engine.has_unfinished_requests()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0), "blocks left held"


def _fail_rows_of_doomed(monkeypatch, after_calls: int) -> None:
    """TokenSampler's row builder raises for the request seeded 424242 from its after_calls-th row on."""
    original = TokenSampler._row
    calls = {"doomed": 0}

    def row(self, request, drafts=()):
        if request.sampling_params.seed == DOOMED.seed:
            calls["doomed"] += 1
            if calls["doomed"] >= after_calls:
                raise OverflowError("injected row-builder fault")
        return original(self, request, drafts)

    monkeypatch.setattr(TokenSampler, "_row", row)


def test_a_detokenizer_fault_fails_only_its_request(tiny_llm, monkeypatch):
    """The doomed request's detokenizer raises at its third token: it ends with finish_reason "error" and the error,
    its blocks are freed, and the healthy request beside it samples exactly the tokens it samples alone."""
    engine = tiny_llm.engine
    alone = tiny_llm.generate(HEALTHY_PROMPT, HEALTHY, use_tqdm=False)[0].outputs[0].token_ids
    engine.add_request("healthy", HEALTHY_PROMPT, HEALTHY)
    engine.add_request("doomed", "A request whose text cannot be made", DOOMED)
    detokenizer = engine.requests.samples["doomed"][1].detokenizer
    original, calls = detokenizer.append_token, [0]

    def append_token(token_id: int) -> None:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("injected detokenizer fault")
        original(token_id)

    monkeypatch.setattr(detokenizer, "append_token", append_token)
    finals = _run(engine)

    doomed = finals["doomed"]
    assert doomed.finished and doomed.error == "RuntimeError: injected detokenizer fault"
    assert [sample.finish_reason for sample in doomed.outputs] == ["error"]
    assert len(doomed.outputs[0].token_ids) == 3  # the tokens up to the one whose text raised
    healthy = finals["healthy"]
    assert healthy.error is None and healthy.outputs[0].finish_reason == "length"
    assert healthy.outputs[0].token_ids == alone
    _assert_engine_idle(engine)


def test_a_row_builder_fault_fails_only_its_request(tiny_llm, monkeypatch):
    """The sampler cannot build the doomed request's row from its second step on: that row is sampled as padding
    and the request fails; the healthy request in the same batch keeps its seeded draws token for token."""
    engine = tiny_llm.engine
    alone = tiny_llm.generate(HEALTHY_PROMPT, HEALTHY, use_tqdm=False)[0].outputs[0].token_ids
    _fail_rows_of_doomed(monkeypatch, after_calls=2)
    engine.add_request("healthy", HEALTHY_PROMPT, HEALTHY)
    engine.add_request("doomed", "A request whose row cannot be built", DOOMED)
    finals = _run(engine)

    assert finals["doomed"].error == "OverflowError: injected row-builder fault"
    assert finals["doomed"].outputs[0].finish_reason == "error"
    assert finals["healthy"].outputs[0].token_ids == alone
    _assert_engine_idle(engine)


def test_n_samples_fail_together_and_free_every_block(tiny_llm, monkeypatch):
    """A request of n = 3 whose first sample's row fails ends as a whole (every sample "error"), the held-back and
    running samples' blocks all freed."""
    engine = tiny_llm.engine
    _fail_rows_of_doomed(monkeypatch, after_calls=3)
    engine.add_request("doomed-n", "Three samples of a doomed request", SamplingParams(
        n=3, temperature=1.0, max_tokens=12, ignore_eos=True, seed=DOOMED.seed))
    finals = _run(engine)

    assert finals["doomed-n"].error is not None
    assert [sample.finish_reason for sample in finals["doomed-n"].outputs] == ["error"] * 3
    _assert_engine_idle(engine)


def test_generate_raises_naming_the_failed_request_and_the_engine_goes_on(tiny_llm, monkeypatch):
    """LLM.generate raises RequestFailedError naming the failed prompt's index; the batch's other requests are
    dropped, and the next generate runs normally."""
    _fail_rows_of_doomed(monkeypatch, after_calls=1)
    with pytest.raises(RequestFailedError, match=r"prompt 1 of the batch: OverflowError: injected") as error:
        tiny_llm.generate(["a fine prompt", "a doomed prompt"], [HEALTHY, DOOMED], use_tqdm=False)
    assert error.value.request_id and "injected row-builder fault" in error.value.reason
    _assert_engine_idle(tiny_llm.engine)
    monkeypatch.undo()
    assert tiny_llm.generate("still works", HEALTHY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("top_k", [-1, 1, 2**31, 10**309])
def test_top_k_at_or_past_the_vocabulary_samples_as_top_k_off(tiny_llm, top_k):
    """top_k -1, 0 and anything >= the vocabulary keep every token (10**309 used to overflow the row table and
    kill the loop); top_k 1 is greedy. Seeded draws compare token for token."""
    vocab_size = tiny_llm.engine.vocab_size
    off = tiny_llm.generate(HEALTHY_PROMPT, SamplingParams(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids
    greedy = tiny_llm.generate(HEALTHY_PROMPT, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                               use_tqdm=False)[0].outputs[0].token_ids
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True, top_k=top_k)
    tokens = tiny_llm.generate(HEALTHY_PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids
    assert tokens == (greedy if top_k == 1 else off)
    assert top_k in (-1, 1) or top_k >= vocab_size
