"""Clients that leave: their requests are aborted at once and their KV blocks freed, mid-stream or before the
first token, streaming or not."""

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_helpers import wait_until_idle

pytestmark = pytest.mark.xdist_group("server")

MAX_TOKENS = 48
NUM_CLIENTS = 32
LONG_PROMPT = " ".join(["hello"] * 400)  # two 256-token prefill chunks before the first token


def _aborted_sequences(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "jaxpaged_sequences_finished":
            return sum(s.value for s in family.samples
                       if s.name.endswith("_total") and s.labels.get("finish_reason") == "abort")
    return 0.0


async def _stream(client: httpx.AsyncClient, model_name: str, disconnect_after: int | None) -> list[dict]:
    import json

    chunks = []
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS, "stream": True,
            "temperature": 1.0, "ignore_eos": True}
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: "):]))
                if disconnect_after is not None and len(chunks) >= disconnect_after:
                    break  # leaving the block closes the connection mid-stream
    return chunks


def test_32_streams_half_disconnect(server, async_engine, model_name):
    """32 concurrent streams, 16 leave after 3 chunks: those are aborted (tokens stop), the rest finish, and
    the KV cache is back to 0 once all are gone."""
    before_tokens = async_engine.get_stats().generation_tokens_total
    before_aborted = _aborted_sequences(server.base_url)

    async def run_all():
        limits = httpx.Limits(max_connections=2 * NUM_CLIENTS)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*[_stream(client, model_name, 3 if i % 2 else None)
                                          for i in range(NUM_CLIENTS)])

    results = asyncio.run(run_all())
    for i, chunks in enumerate(results):
        if i % 2:
            assert len(chunks) == 3
        else:
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    wait_until_idle(async_engine, timeout_s=15)
    generated = async_engine.get_stats().generation_tokens_total - before_tokens
    num_kept = NUM_CLIENTS // 2
    assert generated >= num_kept * MAX_TOKENS
    # Had the 16 run on, they would have added 16 * 48 more; aborted, each adds at most a few steps' worth.
    assert generated <= num_kept * MAX_TOKENS + num_kept * 20, generated
    assert _aborted_sequences(server.base_url) - before_aborted == num_kept


def _wait_idle_quickly(async_engine, started: float, budget_s: float) -> None:
    wait_until_idle(async_engine, timeout_s=budget_s)
    assert time.monotonic() - started < budget_s


def test_stream_closed_before_first_token(server, async_engine, model_name):
    """Closing a stream right after its headers (still prefilling) aborts the request."""
    before = async_engine.get_stats().generation_tokens_total
    started = time.monotonic()
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json={"model": model_name, "prompt": LONG_PROMPT,
                                                            "max_tokens": 100, "stream": True,
                                                            "ignore_eos": True}) as response:
            assert response.status_code == 200
    _wait_idle_quickly(async_engine, started, 10.0)
    assert async_engine.get_stats().generation_tokens_total - before < 10


def test_non_streaming_client_gone_before_first_token(server, async_engine, model_name):
    """A non-streaming client that times out and leaves has its request aborted, not run to max_tokens."""
    before = async_engine.get_stats().generation_tokens_total
    started = time.monotonic()
    with httpx.Client(base_url=server.base_url, timeout=0.3) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/completions", json={"model": model_name, "prompt": LONG_PROMPT, "max_tokens": 100,
                                                 "ignore_eos": True})
    _wait_idle_quickly(async_engine, started, 10.0)
    assert async_engine.get_stats().generation_tokens_total - before < 30


def test_chat_stream_closed_mid_stream(server, async_engine, model_name):
    """The chat stream aborts the same way after its first content chunk."""
    before = async_engine.get_stats().generation_tokens_total
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        body = {"model": model_name, "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 200, "stream": True, "ignore_eos": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # the role chunk
            assert next(line for line in lines if '"content"' in line and line.startswith("data: {"))
    wait_until_idle(async_engine, timeout_s=10)
    assert async_engine.get_stats().generation_tokens_total - before < 40
