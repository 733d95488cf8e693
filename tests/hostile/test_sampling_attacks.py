"""Issue 56's sampling attacks against a live server, sent as raw JSON text while a normal stream runs beside them.

`"top_k": 10**309` (valid JSON) used to overflow the sampler's row table: every request in flight failed with 503
and the process exited with code 5. A 5,000-digit logit_bias key answered 500. Each attack must now get a 400
naming its field, or a 200 with the value clamped as vLLM does, and the concurrent stream must finish normally.
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.hostile.live_server import LiveServer

pytestmark = pytest.mark.xdist_group("hostile")  # the session's hostile_server, started once on one worker

PROMPT = "Once upon a time"
SEEDED = '"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 7'
"""The attacks' common fields: a seeded draw, so a clamped top_k can be compared with top_k off token for token."""

HUGE = "1" + "0" * 309
"""10**309 written out: valid JSON, past float64's range."""


def _seeded(fields: str = "") -> str:
    """The raw JSON body of the common seeded request with `fields` (raw JSON members) added."""
    return "{" + SEEDED + (", " + fields if fields else "") + "}"


def _short(fields: str) -> str:
    """The raw JSON body of a 2-token request with `fields` added."""
    return '{"prompt": "hi", "max_tokens": 2, ' + fields + "}"


BAD_REQUESTS = [  # (name, raw JSON body, the field the 400 must name, or None for a JSON-level refusal)
    ("top-k-below-minus-one", _seeded('"top_k": -2'), "top_k"),
    ("logit-bias-key-5000-digits", _seeded('"logit_bias": {"' + "9" * 5000 + '": 1}'), "logit_bias"),
    ("logit-bias-key-oov", _seeded('"logit_bias": {"4294967296": 1}'), "logit_bias"),
    ("top-p-nan", _seeded('"top_p": NaN'), None),
    ("temperature-1e999", _seeded('"temperature": 1e999'), None),
    ("min-p-infinity", _seeded('"min_p": Infinity'), None),
    ("logit-bias-nan", _seeded('"logit_bias": {"5": NaN}'), None),
    ("logit-bias-minus-1e999", _seeded('"logit_bias": {"5": -1e999}'), None),
    ("repetition-penalty-denormal", _seeded('"repetition_penalty": 1e-45'), "repetition_penalty"),
    ("seed-2-64", _short(f'"seed": {2**64}'), "seed"),
    ("seed-10-309", _short(f'"seed": {HUGE}'), "seed"),
    ("max-tokens-10-309", '{"prompt": "hi", "max_tokens": ' + HUGE + "}", "max_tokens"),
    ("min-tokens-10-309", _short(f'"min_tokens": {HUGE}'), "min_tokens"),
    ("logprobs-10-309", _short(f'"logprobs": {HUGE}'), "logprobs"),
    ("n-10-309", _short(f'"n": {HUGE}'), "prompt"),  # prompts x n over the server's cap
    ("stop-token-id-10-309", _short(f'"stop_token_ids": [{HUGE}]'), "stop_token_ids"),
]

CLAMPED_REQUESTS = [  # (name, raw JSON body): answered 200 with the same text as top_k off
    ("top-k-10-309", _seeded(f'"top_k": {HUGE}')),
    ("top-k-2-31", _seeded(f'"top_k": {2**31}')),
    ("top-k-vocab-plus-1", _seeded('"top_k": 49153')),
    ("logit-bias-minus-1e300-on-an-unlikely-token", _seeded('"logit_bias": {"0": -1e300}')),
]


@pytest.fixture
def server(hostile_server) -> LiveServer:
    """The shared live server (tests/hostile/conftest.py)."""
    return hostile_server


def _post_raw(server: LiveServer, raw: str) -> httpx.Response:
    headers = {**server.headers, "Content-Type": "application/json"}
    return httpx.post(server.base_url + "/v1/completions", content=raw.encode(), headers=headers, timeout=120)


def _normal_stream(server: LiveServer, started: threading.Event) -> list[dict]:
    """A greedy 120-token stream; `started` is set at its first event (the attacks then run beside it)."""
    body = {"prompt": PROMPT, "max_tokens": 120, "temperature": 0, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, headers=server.headers,
                      timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line:
                started.set()
                events.append({"done": True} if line == "data: [DONE]" else json.loads(line[len("data: "):]))
    return events


def test_sampling_attacks_are_refused_or_clamped_while_a_stream_runs(server):
    """Every attack gets a 400 naming its field (or a JSON-level 400), or a clamped 200 equal to top_k off; the
    stream running beside them ends with its 120 tokens, finish_reason "length" and [DONE]; the server still
    serves."""
    reference = _post_raw(server, _seeded())
    assert reference.status_code == 200, reference.text
    off_text = reference.json()["choices"][0]["text"]
    started = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_normal_stream, server, started)
        assert started.wait(120), "the normal stream never started"
        for name, raw, field in BAD_REQUESTS:
            response = _post_raw(server, raw)
            assert response.status_code == 400, (name, response.text)
            error = response.json()["error"]
            assert error["param"] == field, (name, error)
            assert "9" * 50 not in error["message"] and "0" * 50 not in error["message"], (name, "echoed input")
        for name, raw in CLAMPED_REQUESTS:
            response = _post_raw(server, raw)
            assert response.status_code == 200, (name, response.text)
            assert response.json()["choices"][0]["text"] == off_text, name
        events = stream.result(timeout=300)
    assert events[-1] == {"done": True}
    assert not any("error" in event for event in events)
    choices = [event["choices"][0] for event in events[:-1] if event.get("choices")]
    assert choices[-1]["finish_reason"] == "length"
    server.assert_still_serving()
