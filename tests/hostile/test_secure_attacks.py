"""Issue 56 #5 against a live server: /metrics' prefix-cache counters are an oracle of other clients' prompts, so
with --api-key a client without the key gets 401 there (however it spells the path) while the key's holder (the
operator's scraper) still reads them; the server keeps serving."""

import re

import httpx
import pytest

from tests.hostile.live_server import API_KEY, LiveServer

pytestmark = pytest.mark.xdist_group("hostile")  # the session's hostile_server, started once on one worker

HITS = re.compile(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)
VICTIM_PROMPT = "My account password is tangerine-42 and my favourite colour is"


@pytest.fixture
def live(hostile_server) -> LiveServer:
    """The shared keyed live server (tests/hostile/conftest.py)."""
    return hostile_server


def _prefix_cache_hits(text: str) -> float:
    match = HITS.search(text)
    assert match is not None, text[:2000]
    return float(match.group(1))


@pytest.mark.parametrize("path", ["/metrics", "/metrics?format=text", "//metrics", "/%6Detrics", "/metrics/"])
def test_metrics_without_the_key_is_refused(live, path):
    """Every spelling of /metrics without the key (or with a wrong one) gets 401 and no counter: the oracle is
    closed."""
    for headers in ({}, {"Authorization": "Bearer guess"}, {"Authorization": f"Bearer {API_KEY[:-1]}"}):
        response = httpx.get(live.base_url + path, headers=headers, timeout=30, follow_redirects=False)
        assert response.status_code == 401, (path, headers, response.status_code)
        assert "prefix_cache" not in response.text and API_KEY not in response.text
    assert httpx.head(live.base_url + "/metrics", timeout=30).status_code == 401
    live.assert_still_serving()


def test_the_key_holder_still_scrapes_and_the_counter_is_the_oracle(live):
    """With the key /metrics answers 200, and its hit counter does move when a guess shares a victim's prefix:
    what the 401 keeps from a keyless client is real."""
    def hits() -> float:
        response = httpx.get(live.base_url + "/metrics", headers=live.headers, timeout=30)
        assert response.status_code == 200
        return _prefix_cache_hits(response.text)

    assert live.post("/v1/completions", {"prompt": VICTIM_PROMPT, "max_tokens": 1}).status_code == 200  # the victim
    before = hits()
    guess = VICTIM_PROMPT.rsplit(" ", 3)[0] + " something else entirely"
    assert live.post("/v1/completions", {"prompt": guess, "max_tokens": 1}).status_code == 200  # the attacker
    assert hits() > before  # the shared prefix shows in the counter
    live.assert_still_serving()
