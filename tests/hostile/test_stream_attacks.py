"""Issue 56's streaming attacks against a live server (findings 7 and 9).

  - A tool call nested deeper than Python's recursion limit: the client forces the model's output with a
    structured-outputs choice (the random tiny model would never write it), through the hermes parser of
    tool_choice "auto". Before, json.loads raised RecursionError: a 500, or a stream cut off without [DONE].
  - A streamed batch completion (several prompts) whose client stops reading for a while: the server keeps one
    pending output per prompt, and the texts still come out whole and the same as unstreamed.
After each, the server still answers a normal request as before.
"""

import json
import time

import httpx
import pytest

from tests.hostile.live_server import LiveServer

pytestmark = pytest.mark.xdist_group("hostile")  # the session's hostile_server, started once on one worker

DEPTH = 1_000  # past the recursion limit (1,000 frames, some of them the server's own)
DEEP_CALL = "<tool_call>" + "[" * DEPTH
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
BATCH_PROMPTS = [f"Story number {index}: once upon a time" for index in range(6)]
BATCH_MAX_TOKENS = 48
READER_PAUSE_S = 3.0


@pytest.fixture
def live(hostile_server) -> LiveServer:
    """The shared live server (tests/hostile/conftest.py): tool_choice "auto" reads hermes calls, and there is room
    for an output of DEPTH brackets (--max-model-len 1024)."""
    return hostile_server


def _deep_call_request(stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": "Call f."}], "tools": TOOLS, "tool_choice": "auto",
            "structured_outputs": {"choice": [DEEP_CALL]}, "temperature": 0, "stream": stream}


def _sse_payloads(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]


def test_a_deeply_nested_call_comes_back_as_content(live):
    """Unstreamed: 200, the whole output as content, no tool_calls, finish_reason "stop"."""
    response = live.post("/v1/chat/completions", _deep_call_request(stream=False), timeout=240)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == DEEP_CALL and not choice["message"].get("tool_calls")
    assert choice["finish_reason"] == "stop"
    live.assert_still_serving()


def test_a_deeply_nested_call_streams_as_content_and_ends_with_done(live):
    """Streamed: the content deltas add up to the output, no tool_calls, and the stream ends with [DONE]."""
    response = live.post("/v1/chat/completions", _deep_call_request(stream=True), timeout=240)
    assert response.status_code == 200, response.text
    payloads = _sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert all("error" not in chunk for chunk in chunks)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert "".join(delta.get("content") or "" for delta in deltas) == DEEP_CALL
    assert not any(delta.get("tool_calls") for delta in deltas)
    live.assert_still_serving()


def test_a_streamed_batch_read_slowly_comes_out_whole(live):
    """Six prompts streamed to a client that stops reading for 3 s after the first event: the stream ends with
    [DONE] and each prompt's text is the one the same request gets unstreamed."""
    body = {"prompt": BATCH_PROMPTS, "max_tokens": BATCH_MAX_TOKENS, "temperature": 0}
    expected = live.post("/v1/completions", body).json()["choices"]
    texts = {index: "" for index in range(len(BATCH_PROMPTS))}
    payloads: list[str] = []
    with httpx.stream("POST", live.base_url + "/v1/completions", json={**body, "stream": True},
                      headers=live.headers, timeout=120) as response:
        assert response.status_code == 200
        for number, line in enumerate(response.iter_lines()):
            if number == 0:
                time.sleep(READER_PAUSE_S)  # the engine runs on; the server must not queue every step
            if line.startswith("data: "):
                payloads.append(line[len("data: "):])
    assert payloads[-1] == "[DONE]"
    for payload in payloads[:-1]:
        for choice in json.loads(payload)["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == {choice["index"]: choice["text"] for choice in expected}
    live.assert_still_serving()
