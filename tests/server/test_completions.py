"""POST /v1/completions through the official openai client: n, logprobs, stop, seed, echo, batches, usage, SSE."""

import math

import httpx
import pytest

pytestmark = pytest.mark.xdist_group("server")

PROMPT = "The capital of France is"


def _num_prompt_tokens(http, text: str) -> int:
    return http.post("/tokenize", json={"prompt": text}).json()["count"]


def test_n2_with_logprobs_and_usage(client, http, model_name):
    """n=2 gives choices 0 and 1, each max_tokens long, logprobs per token, and usage that adds up."""
    result = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12, n=2, logprobs=3,
                                       temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    assert result.object == "text_completion" and result.model == model_name
    assert sorted(choice.index for choice in result.choices) == [0, 1]
    for choice in result.choices:
        assert choice.finish_reason == "length"
        logprobs = choice.logprobs
        assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 12
        assert "".join(logprobs.tokens) == choice.text
        assert all(value <= 0.0 for value in logprobs.token_logprobs)
        assert all(1 <= len(top) <= 3 for top in logprobs.top_logprobs)
        assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(12)]
    num_prompt = _num_prompt_tokens(http, PROMPT)
    assert result.usage.prompt_tokens == num_prompt
    assert result.usage.completion_tokens == 2 * 12
    assert result.usage.total_tokens == num_prompt + 24


def test_greedy_token_is_top_logprob(client, model_name):
    """At temperature 0 the sampled token is the most likely one: its logprob is the max of the top 5."""
    result = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8, temperature=0.0,
                                       logprobs=5)
    logprobs = result.choices[0].logprobs
    for sampled, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        assert math.isclose(sampled, max(top.values()), rel_tol=1e-5, abs_tol=1e-5)


def test_seed_reproducible(client, model_name):
    """The same seed at temperature 1 gives the same text; n=2 with a seed is reproducible too."""
    def run():
        return client.completions.create(model=model_name, prompt=PROMPT, max_tokens=16, temperature=1.0, n=2,
                                         seed=1234, extra_body={"ignore_eos": True})
    first, second = run(), run()
    assert [c.text for c in first.choices] == [c.text for c in second.choices]


def test_stop_string(client, model_name):
    """A stop string cuts the text just before it, with finish_reason "stop" and the matched stop_reason."""
    full = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0.0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[4:7]
    assert len(stop) == 3 and stop.strip(), full
    cut = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0.0,
                                    stop=[stop, "unlikely-stop-string"]).choices[0]
    assert cut.text == full[:full.index(stop)]
    assert cut.finish_reason == "stop"
    assert cut.model_extra["stop_reason"] == stop


def test_stop_token_ids_and_min_tokens(client, http, model_name):
    """A stop token id ends the choice at that token; min_tokens keeps it from ending the choice at once."""
    greedy = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6, temperature=0.0,
                                       extra_body={"ignore_eos": True}).choices[0].text
    first_id = http.post("/tokenize", json={"prompt": greedy, "add_special_tokens": False}).json()["tokens"][0]
    first_text = http.post("/detokenize", json={"tokens": [first_id]}).json()["prompt"]
    assert greedy.startswith(first_text) and first_text  # the greedy first token is first_id
    stopped = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6, temperature=0.0,
                                        extra_body={"stop_token_ids": [first_id]}).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == ""
    assert stopped.model_extra["stop_reason"] == first_id
    held = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6, temperature=0.0,
                                     extra_body={"stop_token_ids": [first_id], "min_tokens": 1}).choices[0]
    assert held.text != "" and not held.text.startswith(first_text)


def test_echo_and_token_id_prompt(client, http, model_name):
    """A token-id prompt runs like its text; echo puts the prompt text first."""
    token_ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    by_text = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5, temperature=0.0)
    by_ids = client.completions.create(model=model_name, prompt=token_ids, max_tokens=5, temperature=0.0,
                                       echo=True)
    assert by_ids.choices[0].text == PROMPT + by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(token_ids)


def test_batch_of_prompts(client, model_name):
    """A list of prompts gives n choices per prompt, indexed prompt-major, each as if sent alone."""
    prompts = [PROMPT, "One, two, three,"]
    ignore_eos = {"ignore_eos": True}
    batch = client.completions.create(model=model_name, prompt=prompts, max_tokens=4, temperature=0.0, n=2,
                                      extra_body=ignore_eos)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    num_prompt_tokens = 0
    for i, prompt in enumerate(prompts):
        alone = client.completions.create(model=model_name, prompt=prompt, max_tokens=4, temperature=0.0,
                                          extra_body=ignore_eos)
        assert batch.choices[2 * i].text == batch.choices[2 * i + 1].text == alone.choices[0].text
        num_prompt_tokens += alone.usage.prompt_tokens
    assert batch.usage.completion_tokens == 4 * 4
    assert batch.usage.prompt_tokens == num_prompt_tokens


def test_prefix_cache_reported_in_usage(details_server, http, model_name):
    """With --enable-prompt-tokens-details, a repeated 40-token prompt finds all but its last token cached: two
    full 16-token blocks and 7 tokens the first request's last, partly filled block holds (token-granular hits)."""
    prompt = " ".join(f"word{i}" for i in range(60))
    token_ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"][:40]

    def usage_of(salt: str) -> dict:
        body = {"model": model_name, "prompt": token_ids, "max_tokens": 1, "cache_salt": salt}
        return httpx.post(details_server.base_url + "/v1/completions", json=body, timeout=120).json()["usage"]

    usage_of("usage-test")
    again = usage_of("usage-test")
    assert again["prompt_tokens"] == 40
    assert again["prompt_tokens_details"]["cached_tokens"] == 39
    assert usage_of("another-salt")["prompt_tokens_details"]["cached_tokens"] == 0


def test_cached_tokens_hidden_by_default(http, model_name):
    """Without --enable-prompt-tokens-details no usage (whole or streamed) tells a client how much of its prompt
    was already cached: unsalted prefixes are shared, so the count would reveal another client's prompt."""
    body = {"model": model_name, "prompt": " ".join(f"probe{i}" for i in range(30)), "max_tokens": 1}
    for _ in range(2):  # the second one hits the prefix cache
        usage = http.post("/v1/completions", json=body).json()["usage"]
        assert usage["prompt_tokens"] > 0 and "prompt_tokens_details" not in usage
    streamed = http.post("/v1/completions", json=body | {"stream": True, "stream_options": {"include_usage": True}})
    assert '"prompt_tokens"' in streamed.text and "prompt_tokens_details" not in streamed.text
    chat = http.post("/v1/chat/completions", json={"model": model_name, "max_tokens": 1,
                                                    "messages": [{"role": "user", "content": "hi"}]}).json()
    assert "prompt_tokens_details" not in chat["usage"]


def test_stream_deltas_add_up(client, model_name):
    """Streamed deltas concatenate to the non-streamed text; logprobs arrive per token; usage comes last."""
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=16, temperature=0.0, logprobs=2,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text_chunks = [chunk for chunk in chunks if chunk.choices]
    assert "".join(chunk.choices[0].text for chunk in text_chunks) == whole.text
    assert sum(len(chunk.choices[0].logprobs.tokens) for chunk in text_chunks) == 16
    assert [chunk.choices[0].finish_reason for chunk in text_chunks][-1] == "length"
    assert all(chunk.choices[0].finish_reason is None for chunk in text_chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert len({chunk.id for chunk in chunks}) == 1


def test_stream_n2_without_usage(client, model_name):
    """With n=2 each chunk carries one choice; both choices finish; no usage chunk unless asked for."""
    chunks = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6, n=2, stream=True,
                                            temperature=0.0, extra_body={"ignore_eos": True}))
    assert all(len(chunk.choices) == 1 for chunk in chunks)
    finished = {chunk.choices[0].index for chunk in chunks if chunk.choices[0].finish_reason == "length"}
    assert finished == {0, 1}
    texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)]
    assert texts[0] == texts[1] != ""
    assert all(chunk.usage is None for chunk in chunks)


def test_raw_sse_ends_with_done(http, model_name):
    """The raw event stream is `data: {json}` events and ends with `data: [DONE]`."""
    with http.stream("POST", "/v1/completions", json={"model": model_name, "prompt": PROMPT, "max_tokens": 3,
                                                        "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
