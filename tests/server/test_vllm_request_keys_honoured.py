"""vLLM's request keys this server honours as vLLM does: return_token_ids, request_id, allowed_token_ids and
bad_words, on completions and chat, whole and streamed."""

import concurrent.futures
import json
from typing import Any

import httpx
import pytest

from jaxpaged.sampling.batch import banned_bad_word_ids
from jaxpaged.server.vllm.bad_words import bad_words_token_ids

pytestmark = pytest.mark.xdist_group("server")

ASK = [{"role": "user", "content": "Count to five."}]
GREEDY = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def _events(http, path: str, body: dict) -> list[dict]:
    """The JSON chunks of one streamed request (the [DONE] line left out)."""
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _post(http, path: str, body: dict) -> dict[str, Any]:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_return_token_ids_on_completions_whole_and_streamed(http, async_engine, model_name):
    """Each completion choice carries its prompt's ids and its output ids; the stream's ids add up to the same."""
    tokenizer = async_engine.tokenizer
    body = {"model": model_name, "prompt": ["The sky is", "One, two,"], "return_token_ids": True, **GREEDY}
    whole = _post(http, "/v1/completions", body)
    for choice, prompt in zip(whole["choices"], body["prompt"]):
        assert choice["prompt_token_ids"] == tokenizer.encode(prompt)
        assert len(choice["token_ids"]) == GREEDY["max_tokens"]
        assert tokenizer.decode(choice["token_ids"]) == choice["text"]
    streamed: dict[int, list[int]] = {0: [], 1: []}
    prompt_ids: dict[int, list] = {}
    for chunk in _events(http, "/v1/completions", body):
        for choice in chunk["choices"]:
            streamed[choice["index"]] += choice["token_ids"]
            if "prompt_token_ids" in choice:
                assert choice["index"] not in prompt_ids, "prompt ids sent twice"
                prompt_ids[choice["index"]] = choice["prompt_token_ids"]
    assert [streamed[i] for i in (0, 1)] == [choice["token_ids"] for choice in whole["choices"]]
    assert [prompt_ids[i] for i in (0, 1)] == [choice["prompt_token_ids"] for choice in whole["choices"]]
    plain = _post(http, "/v1/completions", {**body, "return_token_ids": False})
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]


def test_return_token_ids_on_chat_whole_and_streamed(http, async_engine, model_name):
    """A chat response carries the rendered prompt's ids once, each choice its output ids; streamed alike."""
    body = {"model": model_name, "messages": ASK, "return_token_ids": True, **GREEDY}
    whole = _post(http, "/v1/chat/completions", body)
    assert len(whole["prompt_token_ids"]) == whole["usage"]["prompt_tokens"]
    choice = whole["choices"][0]
    assert len(choice["token_ids"]) == GREEDY["max_tokens"]
    assert async_engine.tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == \
        choice["message"]["content"]
    chunks = _events(http, "/v1/chat/completions", body)
    assert [chunk for chunk in chunks if "prompt_token_ids" in chunk] == chunks[:1]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert [token for chunk in chunks for token in chunk["choices"][0]["token_ids"]] == choice["token_ids"]


def test_request_id_names_the_response_and_two_clients_may_share_it(server, http, model_name):
    """The client's request_id is the response id (cmpl-/chatcmpl-), whole and streamed; two requests in flight with
    the same request_id both complete, as the engine's own ids stay unique."""
    body = {"model": model_name, "prompt": "Hello", "request_id": "client-7", **GREEDY}
    assert _post(http, "/v1/completions", body)["id"] == "cmpl-client-7"
    assert {chunk["id"] for chunk in _events(http, "/v1/completions", body)} == {"cmpl-client-7"}
    chat = {"model": model_name, "messages": ASK, "request_id": "client-7", **GREEDY}
    assert _post(http, "/v1/chat/completions", chat)["id"] == "chatcmpl-client-7"
    assert {chunk["id"] for chunk in _events(http, "/v1/chat/completions", chat)} == {"chatcmpl-client-7"}

    def run_one(_: int) -> dict:
        with httpx.Client(base_url=server.base_url, timeout=120) as session:
            return _post(session, "/v1/completions", {**body, "max_tokens": 24})

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        both = list(pool.map(run_one, range(2)))
    assert [response["id"] for response in both] == ["cmpl-client-7"] * 2
    assert [len(response["choices"][0]["text"]) > 0 for response in both] == [True, True]
    assert _post(http, "/v1/completions", {**body, "request_id": None})["id"].startswith("cmpl-")
    response = http.post("/v1/completions", json={**body, "request_id": ""})
    assert response.status_code == 400 and response.json()["error"]["param"] == "request_id"


def _contains(tokens: list[int], sequence: list[int]) -> bool:
    return any(tokens[i:i + len(sequence)] == sequence for i in range(len(tokens) - len(sequence) + 1))


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_allowed_token_ids_restrict_every_sampled_token(http, async_engine, model_name, path):
    """With allowed_token_ids, every generated token is one of them, even sampled at temperature 1; an id outside
    the vocabulary is a 400 naming the field."""
    tokenizer = async_engine.tokenizer
    allowed = sorted({tokenizer.encode(word, add_special_tokens=False)[0] for word in (" cat", " dog", " 7")})
    prompt = {"prompt": "Once upon a time"} if path == "/v1/completions" else {"messages": ASK}
    body = {"model": model_name, **prompt, **GREEDY, "temperature": 1.0, "seed": 3, "n": 2,
            "allowed_token_ids": allowed, "return_token_ids": True}
    for choice in _post(http, path, body)["choices"]:
        assert len(choice["token_ids"]) == GREEDY["max_tokens"]
        assert set(choice["token_ids"]) <= set(allowed), choice["token_ids"]
    only = _post(http, path, {**body, "allowed_token_ids": allowed[:1], "n": 1})["choices"][0]["token_ids"]
    assert only == allowed[:1] * GREEDY["max_tokens"]
    response = http.post(path, json={**body, "allowed_token_ids": [async_engine.vocab_size]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "allowed_token_ids", response.text


def test_banned_bad_word_ids_follow_vllms_rule():
    """A one-token bad word is always banned; a longer one bans its last token only right after its other ones."""
    words = [[5], [1, 2, 3], [9, 4]]
    assert banned_bad_word_ids(words, []) == [5]
    assert banned_bad_word_ids(words, [7, 1, 2]) == [5, 3]
    assert banned_bad_word_ids(words, [1, 2, 7]) == [5]
    assert banned_bad_word_ids(words, [2]) == [5]
    assert banned_bad_word_ids(words, [1, 2, 9]) == [5, 4]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_words_are_never_generated(http, async_engine, model_name, path):
    """The greedy output's own words, given as bad_words, disappear from the next greedy output."""
    tokenizer = async_engine.tokenizer
    prompt = {"prompt": "The capital of France is"} if path == "/v1/completions" else {"messages": ASK}
    body = {"model": model_name, **prompt, **GREEDY, "return_token_ids": True}
    first = _post(http, path, body)["choices"][0]["token_ids"]
    words = [tokenizer.decode(first[:1]), tokenizer.decode(first[1:3])]
    banned = bad_words_token_ids(tokenizer, words)
    assert first[:1] in banned  # the word as the model spelled it
    again = _post(http, path, {**body, "bad_words": words})["choices"][0]["token_ids"]
    assert again[0] != first[0]
    for sequence in banned:
        assert not _contains(again, sequence), (sequence, again)
    response = http.post(path, json={**body, "bad_words": [""]})
    assert response.status_code == 400 and response.json()["error"]["param"].startswith("bad_words"), response.text


def test_prompt_logprobs_on_completions_match_the_echoed_prompts(http, model_name):
    """prompt_logprobs: None for the first token, then the token itself and the k most likely (ranks 1..k), the
    token's logprob the same as echo + logprobs reports; per completion choice."""
    body = {"model": model_name, "prompt": "The quick brown fox jumps", "max_tokens": 1, "temperature": 0.0,
            "return_token_ids": True}
    choice = _post(http, "/v1/completions", {**body, "prompt_logprobs": 2})["choices"][0]
    echoed = _post(http, "/v1/completions", {**body, "echo": True, "logprobs": 1})["choices"][0]["logprobs"]
    prompt_ids, prompt_logprobs = choice["prompt_token_ids"], choice["prompt_logprobs"]
    assert len(prompt_logprobs) == len(prompt_ids) and prompt_logprobs[0] is None
    for position, (token_id, entries) in enumerate(zip(prompt_ids[1:], prompt_logprobs[1:]), start=1):
        assert str(token_id) in entries
        assert entries[str(token_id)]["logprob"] == pytest.approx(echoed["token_logprobs"][position], abs=1e-4)
        assert sorted(entry["rank"] for entry in entries.values())[:2] == [1, 2]
        assert len(entries) == (2 if entries[str(token_id)]["rank"] <= 2 else 3)
        best = max(entries.values(), key=lambda entry: entry["logprob"])
        assert best["rank"] == 1 and isinstance(best["decoded_token"], str)
    assert "prompt_logprobs" not in _post(http, "/v1/completions", body)["choices"][0]


def test_prompt_logprobs_on_chat_and_refused_when_streaming(http, model_name):
    """Chat carries prompt_logprobs at the response's level, one entry per prompt token; streaming with them is a
    400 naming the field, as in vLLM."""
    body = {"model": model_name, "messages": ASK, "max_tokens": 1, "prompt_logprobs": 0, "return_token_ids": True}
    whole = _post(http, "/v1/chat/completions", body)
    prompt_logprobs = whole["prompt_logprobs"]
    assert len(prompt_logprobs) == whole["usage"]["prompt_tokens"] and prompt_logprobs[0] is None
    for token_id, entries in zip(whole["prompt_token_ids"][1:], prompt_logprobs[1:]):
        assert str(token_id) in entries and entries[str(token_id)]["logprob"] <= 0.0
        assert list(entries) == [str(token_id)]  # k = 0: the token alone
    for path, prompt in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "Hi"})):
        response = http.post(path, json={"model": model_name, **prompt, "prompt_logprobs": 1, "stream": True})
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt_logprobs", response.text


def test_return_tokens_as_token_ids_spells_each_logprob_token_by_its_id(http, model_name):
    """return_tokens_as_token_ids: every logprob token (sampled and alternatives) is "token_id:<id>", the sampled
    ones the very ids return_token_ids gives; the text itself is unchanged."""
    chat = _post(http, "/v1/chat/completions", {"model": model_name, "messages": ASK, "logprobs": True,
                                                "top_logprobs": 2, "return_token_ids": True,
                                                "return_tokens_as_token_ids": True, **GREEDY})
    choice = chat["choices"][0]
    assert [entry["token"] for entry in choice["logprobs"]["content"]] == \
        [f"token_id:{token_id}" for token_id in choice["token_ids"]]
    assert all(alt["token"].startswith("token_id:") for entry in choice["logprobs"]["content"]
               for alt in entry["top_logprobs"])
    body = {"model": model_name, "prompt": "The sky is", "logprobs": 1, "return_token_ids": True, **GREEDY}
    spelled = _post(http, "/v1/completions", {**body, "return_tokens_as_token_ids": True})["choices"][0]
    plain = _post(http, "/v1/completions", body)["choices"][0]
    assert spelled["logprobs"]["tokens"] == [f"token_id:{token_id}" for token_id in spelled["token_ids"]]
    assert spelled["text"] == plain["text"] and plain["logprobs"]["tokens"][0] != spelled["logprobs"]["tokens"][0]
