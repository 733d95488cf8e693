"""Bad input: the listed status and the OpenAI error body, no echo of the input, nothing sent to the engine,
and the server healthy and serving afterwards."""

import json

import pytest

pytestmark = pytest.mark.xdist_group("server")

MARK = "ECHO-MARK-7f3a"
"""Put into offending string values: it must never come back in an error."""

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
IMAGE_MESSAGES = [{"role": "user", "content": [
    {"type": "text", "text": "What is in this picture?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + MARK}}]}]
LONG_TEXT = " ".join(["hello"] * 600)  # ~600 tokens, over max_model_len=512


def _body(**fields) -> bytes:
    return json.dumps({"prompt": "hi", "max_tokens": 2, **fields}).encode()


# (id, path, raw body, status, param, a piece of the input that must not come back)
CASES = [
    ("nan", COMPLETIONS, b'{"prompt": "hi", "temperature": NaN}', 400, None, None),
    ("infinity", COMPLETIONS, b'{"prompt": "hi", "top_p": Infinity}', 400, None, None),
    ("minus-infinity-bias", COMPLETIONS, b'{"prompt": "hi", "logit_bias": {"5": -Infinity}}', 400, None,
     None),
    ("overflow-to-inf", COMPLETIONS, b'{"prompt": "hi", "presence_penalty": 1e999}', 400, None, "1e999"),
    ("negative-max-tokens", COMPLETIONS, _body(max_tokens=-12345), 400, "max_tokens", "-12345"),
    ("negative-temperature", COMPLETIONS, _body(temperature=-1.2345), 400, "temperature", "-1.2345"),
    ("top-p-above-1", COMPLETIONS, _body(top_p=1.2345), 400, "top_p", "1.2345"),
    ("n-zero", COMPLETIONS, _body(n=0), 400, "n", None),
    ("penalty-out-of-range", COMPLETIONS, _body(frequency_penalty=2.2345), 400, "frequency_penalty", "2.2345"),
    ("top-k-negative", COMPLETIONS, _body(top_k=-7), 400, "top_k", None),
    ("min-p-above-1", COMPLETIONS, _body(min_p=3.5), 400, "min_p", "3.5"),
    ("logit-bias-key-of-5000-digits", COMPLETIONS, _body(logit_bias={"9" * 5000: 1.0}), 400, "logit_bias",
     "9" * 50),
    ("logit-bias-unicode-digit-key", COMPLETIONS, _body(logit_bias={"\u00b2": 1.0}), 400, "logit_bias", None),
    ("seed-too-big", COMPLETIONS, _body(seed=2**70), 400, "seed", str(2**70)),
    ("min-tokens-over-max", COMPLETIONS, _body(max_tokens=2, min_tokens=3), 400, "min_tokens", None),
    ("number-as-string", COMPLETIONS, _body(max_tokens="5"), 400, "max_tokens", None),
    ("empty-prompt", COMPLETIONS, _body(prompt=""), 400, "prompt", None),
    ("empty-token-prompt", COMPLETIONS, _body(prompt=[]), 400, "prompt", None),
    ("empty-prompt-in-batch", COMPLETIONS, _body(prompt=["hi", ""]), 400, "prompt", None),
    ("empty-messages", CHAT, json.dumps({"messages": []}).encode(), 400, "messages", None),
    ("image-part", CHAT, json.dumps({"messages": IMAGE_MESSAGES}).encode(), 400, "messages[0]", MARK),
    ("bad-role", CHAT, json.dumps({"messages": [{"role": MARK, "content": "x"}]}).encode(), 400, None, MARK),
    ("prompt-over-max-model-len", COMPLETIONS, _body(prompt=LONG_TEXT + MARK), 400, "prompt", MARK),
    ("prompt-plus-max-tokens-over", COMPLETIONS, _body(max_tokens=512), 400, "max_tokens", None),
    ("chat-prompt-plus-max-tokens-over", CHAT, json.dumps({"messages": USER, "max_completion_tokens": 512}).encode(),
     400, "max_completion_tokens", None),
    ("oov-prompt-id", COMPLETIONS, _body(prompt=[1, 49153]), 400, "prompt", "49153"),
    ("negative-prompt-id", COMPLETIONS, _body(prompt=[1, -3]), 400, "prompt", None),
    ("oov-stop-token-id", COMPLETIONS, _body(stop_token_ids=[987654]), 400, "stop_token_ids", "987654"),
    ("oov-logit-bias-key", COMPLETIONS, _body(logit_bias={"987654": 1.0}), 400, "logit_bias", "987654"),
    ("non-numeric-logit-bias-key", COMPLETIONS, _body(logit_bias={MARK: 1.0}), 400, "logit_bias", MARK),
    ("17-stop-strings", COMPLETIONS, _body(stop=[f"{MARK}{i}" for i in range(17)]), 400, "stop", MARK),
    ("empty-stop-string", COMPLETIONS, _body(stop=["ok", ""]), 400, "stop", None),
    ("logprobs-21", COMPLETIONS, _body(logprobs=21), 400, "logprobs", None),
    ("top-logprobs-21", CHAT, json.dumps({"messages": USER, "logprobs": True, "top_logprobs": 21}).encode(), 400,
     "top_logprobs", None),
    ("top-logprobs-without-logprobs", CHAT, json.dumps({"messages": USER, "top_logprobs": 2}).encode(), 400,
     "top_logprobs", None),
    ("n-over-max-n", COMPLETIONS, _body(n=17), 400, "n", None),
    ("prompts-over-cap", COMPLETIONS, _body(prompt=[[1]] * 1025), 400, "prompt", None),
    ("prompts-times-n-over-cap", COMPLETIONS, _body(prompt=["hi"] * 600, n=2), 400, "prompt", None),
    ("malformed-json", COMPLETIONS, b'{"prompt": "hi", ', 400, None, None),
    ("json-not-an-object", COMPLETIONS, b'["hi"]', 400, None, None),
    ("huge-integer-literal", COMPLETIONS, b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", 400, None, "999"),
    ("deep-nesting", COMPLETIONS, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None, None),
    ("lone-surrogate", COMPLETIONS, b'{"prompt": "' + MARK.encode() + b'\\ud800"}', 400, None, MARK),
    ("invalid-utf8", COMPLETIONS, b'{"prompt": "' + MARK.encode() + b'\xff\xfe"}', 400, None, MARK),
    ("unknown-model", COMPLETIONS, _body(model=MARK), 404, "model", MARK),
    ("unknown-model-chat", CHAT, json.dumps({"model": MARK, "messages": USER}).encode(), 404, "model", MARK),
    ("body-over-2MiB", COMPLETIONS, _body(prompt="a" * (2 * 1024 * 1024)), 413, None, None),
    ("suffix-unsupported", COMPLETIONS, _body(suffix=MARK), 400, "suffix", MARK),
    ("invalid-json-schema", CHAT, json.dumps({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}}).encode(), 400,
     "response_format.json_schema.schema", None),
    ("json-schema-missing", CHAT, json.dumps({"messages": USER, "response_format": {"type": "json_schema"}}).encode(),
     400, "response_format.json_schema", None),
    ("invalid-guided-regex", COMPLETIONS, _body(guided_regex="a(b"), 400, "guided_regex", None),
    ("invalid-guided-grammar", COMPLETIONS, _body(guided_grammar="start: nowhere"), 400, "guided_grammar", None),
    ("unsatisfiable-guided-json", COMPLETIONS, _body(guided_json={"type": "integer", "minimum": 5, "maximum": 2}),
     400, "guided_json", None),
    ("empty-guided-choice", COMPLETIONS, _body(guided_choice=[]), 400, "guided_choice", None),
    ("max-tokens-zero-without-echo", COMPLETIONS, _body(max_tokens=0), 400, "max_tokens", None),
    ("two-constraints", COMPLETIONS, _body(guided_regex="a", guided_choice=["a"]), 400, "guided_choice", None),
    ("tokenize-neither", "/tokenize", b"{}", 400, None, None),
    ("detokenize-oov", "/detokenize", json.dumps({"tokens": [5, 49152]}).encode(), 400, "tokens", None),
]


@pytest.mark.parametrize("path, body, status, param, secret", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_bad_input_rejected_before_engine(http, async_engine, model_name, path, body, status, param, secret):
    """Status and OpenAI error body; the engine saw no new prompt; the next valid request works."""
    before = async_engine.get_stats().prompt_tokens_total
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}[status]
    if param is not None:
        assert error["param"] == param
    if secret is not None:
        assert secret not in response.text
    assert async_engine.get_stats().prompt_tokens_total == before
    assert http.get("/health").status_code == 200
    ok = http.post(COMPLETIONS, json={"model": model_name, "prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                                  {"type": "input_image", "image_url": "https://example.com/a.png"}])
def test_an_image_part_is_refused_as_unsupported(http, part):
    """A chat message carrying an image gets a 400 that says images are not supported (a text-only engine)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "Describe it."}, part]}]
    response = http.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "images are not supported" in error["message"] and error["param"] == "messages[0]"


def test_unknown_route_and_method_use_error_body(http):
    """Starlette's own 404 and 405 come back in the OpenAI shape too."""
    missing = http.get("/v1/nothing-here")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
    wrong_method = http.get("/v1/completions")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_lying_content_length_is_still_capped(server):
    """A chunked body without Content-Length is counted while read: 413 past 2 MiB."""
    import httpx

    def chunks():
        yield b'{"prompt": "'
        for _ in range(3):
            yield b"a" * (1024 * 1024)
        yield b'"}'

    with httpx.Client(base_url=server.base_url, timeout=60) as session:
        response = session.post(COMPLETIONS, content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
