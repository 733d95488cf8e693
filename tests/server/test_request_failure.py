"""One request failing inside the engine, over HTTP: a 500 OpenAI error body (or, mid-stream, an error event then
[DONE]), while a concurrent stream finishes normally and the engine loop stays alive (no fail-stop)."""

import concurrent.futures
import json

import httpx
import pytest

from jaxpaged.sampling.token_sampler import TokenSampler

pytestmark = pytest.mark.xdist_group("server")

DOOMED_SEED = 424242
"""The fault is injected into the sampling rows of requests with this seed only."""


@pytest.fixture
def doomed_rows(monkeypatch) -> None:
    """TokenSampler's row builder raises for requests seeded DOOMED_SEED, from their third row on (so a stream has
    sent tokens before it fails)."""
    original = TokenSampler._row
    calls: dict[str, int] = {}

    def row(self, request, drafts=()):
        if request.sampling_params.seed == DOOMED_SEED:
            calls[request.request_id] = calls.get(request.request_id, 0) + 1
            if calls[request.request_id] >= 3:
                raise OverflowError("injected row-builder fault")
        return original(self, request, drafts)

    monkeypatch.setattr(TokenSampler, "_row", row)


def _stream_events(http: httpx.Client, body: dict) -> list[str]:
    with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line]


def _normal_stream(http: httpx.Client, model_name: str) -> list[str]:
    return _stream_events(http, {"model": model_name, "prompt": "A normal stream", "max_tokens": 24,
                                 "temperature": 0, "ignore_eos": True})


def test_a_failed_request_gets_a_500_while_a_concurrent_stream_finishes(http, model_name, async_engine,
                                                                        doomed_rows):
    """Non-streaming: the failed request's answer is 500 with code request_failed; the normal stream beside it
    ends with a finish_reason and [DONE]; the engine loop is still alive and serves the next request."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        normal = pool.submit(_normal_stream, http, model_name)
        failed = http.post("/v1/completions", json={"model": model_name, "prompt": "A doomed request",
                                                    "max_tokens": 24, "seed": DOOMED_SEED, "ignore_eos": True})
        events = normal.result(timeout=120)
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert error["code"] == "request_failed" and error["type"] == "internal_server_error"
    assert "OverflowError: injected row-builder fault" in error["message"]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
    assert async_engine.is_alive and http.get("/health").status_code == 200
    again = http.post("/v1/completions", json={"model": model_name, "prompt": "Still serving", "max_tokens": 3})
    assert again.status_code == 200


def test_a_failed_stream_ends_with_an_error_event_then_done(http, model_name, async_engine, doomed_rows):
    """Streaming: the failed request's stream sends its first tokens, then an error event (code request_failed),
    then [DONE]; the engine loop stays alive."""
    events = _stream_events(http, {"model": model_name, "prompt": "A doomed stream", "max_tokens": 24,
                                   "seed": DOOMED_SEED, "ignore_eos": True})
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(event[len("data: "):]) for event in events[:-1]]
    assert payloads[-1]["error"]["code"] == "request_failed"
    assert any(payload.get("choices") for payload in payloads[:-1]), "tokens before the fault were streamed"
    assert async_engine.is_alive
