"""Overload: with max_queued_requests=0, requests beyond the engine's 32 sequence slots get 429 + Retry-After
at once, and every accepted request still finishes."""

import asyncio
import time

import httpx
import pytest

pytestmark = pytest.mark.xdist_group("server")

NUM_REQUESTS = 40  # the engine runs at most 32 sequences
MAX_TOKENS = 24


def test_429_when_queue_would_overflow(overload_server, model_name):
    """A burst of 40 on 32 slots: at least 8 refused fast with 429 and Retry-After; the accepted all finish."""
    body = {"model": model_name, "prompt": "Count to ten:", "max_tokens": MAX_TOKENS, "ignore_eos": True}

    async def one(client: httpx.AsyncClient):
        started = time.monotonic()
        response = await client.post("/v1/completions", json=body)
        return response, time.monotonic() - started

    async def burst():
        limits = httpx.Limits(max_connections=NUM_REQUESTS)
        async with httpx.AsyncClient(base_url=overload_server.base_url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*[one(client) for _ in range(NUM_REQUESTS)])

    results = asyncio.run(burst())
    accepted = [response for response, _ in results if response.status_code == 200]
    refused = [(response, seconds) for response, seconds in results if response.status_code == 429]
    assert len(accepted) + len(refused) == NUM_REQUESTS
    assert 1 <= len(accepted) <= 32
    assert len(refused) >= NUM_REQUESTS - 32
    for response, _seconds in refused:
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    slowest_accepted = max(seconds for response, seconds in results if response.status_code == 200)
    assert max(seconds for _, seconds in refused) < slowest_accepted  # refused at once, not after waiting
    for response in accepted:
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "length" and response.json()["usage"]["completion_tokens"] == MAX_TOKENS


def test_overloaded_openai_client_sees_rate_limit(overload_server, async_engine, model_name):
    """The official client maps the 429 to RateLimitError; a lone request afterwards is served."""
    import openai

    client = openai.OpenAI(base_url=overload_server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    # 33 prompts alone need more sequence slots than the engine has: one would have to wait.
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=model_name, prompt=["hi"] * 33, max_tokens=1)
    usage = client.completions.create(model=model_name, prompt="hi", max_tokens=1).usage
    assert usage is not None and usage.completion_tokens == 1
