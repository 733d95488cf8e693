"""Completions with echo and logprobs (what evaluation harnesses use to score loglikelihoods): the prompt's token
logprobs come from the step's prompt-logprob path and must equal what the sampler reported while generating the
same tokens; max_tokens 0 scores without generating."""

import pytest

pytestmark = pytest.mark.xdist_group("server")


def test_scoring_a_continuation_equals_generating_it(client, http, model_name):
    prompt_ids = http.post("/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    generated = client.completions.create(model=model_name, prompt=prompt_ids, max_tokens=5, temperature=0.0,
                                          logprobs=2, extra_body={"ignore_eos": True})
    gen_logprobs = generated.choices[0].logprobs
    assert gen_logprobs is not None and gen_logprobs.token_logprobs is not None
    continuation = http.post("/tokenize", json={"prompt": generated.choices[0].text,
                                                "add_special_tokens": False}).json()["tokens"]
    scored = client.completions.create(model=model_name, prompt=prompt_ids + continuation, max_tokens=0, echo=True,
                                       logprobs=2, temperature=0.0)
    choice = scored.choices[0]
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    token_logprobs = choice.logprobs.token_logprobs
    assert len(token_logprobs) == len(prompt_ids) + len(continuation)
    assert token_logprobs[0] is None and all(lp is not None for lp in token_logprobs[1:])
    assert len(continuation) == 5  # the greedy text re-tokenizes to the 5 generated tokens
    assert token_logprobs[-5:] == pytest.approx(gen_logprobs.token_logprobs, abs=1e-4)
    assert choice.text == "The capital of France is" + generated.choices[0].text
    assert "".join(choice.logprobs.tokens or []) == choice.text
    assert scored.usage is not None and scored.usage.completion_tokens == 0


def test_echo_logprobs_stream_the_prompt_first(client, model_name):
    chunks = list(client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=3, echo=True,
                                            logprobs=1, temperature=0.0, stream=True,
                                            extra_body={"ignore_eos": True}))
    first = chunks[0].choices[0]
    assert first.text == "Once upon a time" and first.logprobs is not None
    assert first.logprobs.token_logprobs is not None and first.logprobs.token_logprobs[0] is None
    generated = [c.choices[0].logprobs for c in chunks[1:] if c.choices and c.choices[0].logprobs]
    assert sum(len(lp.tokens or []) for lp in generated) == 3


def test_max_tokens_zero_needs_echo(client, model_name):
    import openai

    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_name, prompt="hi", max_tokens=0)
