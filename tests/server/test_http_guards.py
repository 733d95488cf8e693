"""Browser-borne attacks on a local server: a POST body that is not declared JSON (CSRF through a simple
request) gets 415, and with --allowed-hosts a Host header naming another host (DNS rebinding) gets 400; both as
OpenAI error bodies, the server serving on."""

from collections.abc import Iterator

import httpx
import pytest

from jaxpaged.server import ServerSettings, build_app
from tests.server.server_helpers import ServerThread

pytestmark = pytest.mark.xdist_group("server")

ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def hosts_server(async_engine) -> Iterator[ServerThread]:
    """A server started with --allowed-hosts '["localhost", "*.example.com"]'."""
    settings = ServerSettings(allowed_hosts=("localhost", "*.example.com"))
    with ServerThread(build_app(async_engine, settings)) as running:
        yield running


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_declared_json_is_refused_with_415(http, async_engine, path, content_type):
    """What a cross-site form or no-cors fetch can send (text/plain, a form, no type at all) never runs."""
    before = async_engine.get_stats().prompt_tokens_total
    body = b'{"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "tokens": [1], "max_tokens": 1}'
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = http.post(path, content=body, headers=headers)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and error["code"] == "unsupported_media_type"
    assert "application/json" in error["message"]
    assert async_engine.get_stats().prompt_tokens_total == before


def test_json_with_a_charset_is_accepted(http, model_name):
    response = http.post("/v1/completions", content=f'{{"model": "{model_name}", "prompt": "hi", "max_tokens": 1}}',
                         headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert response.status_code == 200, response.text


def test_a_host_outside_allowed_hosts_is_refused(hosts_server, model_name):
    """A rebound name reaches the socket but gets an OpenAI 400; allowed names (and wildcards) are served."""
    with httpx.Client(base_url=hosts_server.base_url, timeout=60) as session:
        for host in ("evil.example", "127.0.0.1", f"127.0.0.1:{hosts_server.port}"):
            refused = session.get("/v1/models", headers={"Host": host})
            assert refused.status_code == 400, host
            error = refused.json()["error"]
            assert set(error) == ERROR_KEYS and error["code"] == "invalid_host"
            assert "evil" not in refused.text
        for host in (f"localhost:{hosts_server.port}", "api.example.com"):
            assert session.get("/health", headers={"Host": host}).status_code == 200, host
        served = session.post("/v1/completions", headers={"Host": "localhost"},
                              json={"model": model_name, "prompt": "hi", "max_tokens": 1})
        assert served.status_code == 200


def test_any_host_is_served_without_allowed_hosts(http):
    assert http.get("/health", headers={"Host": "anything.example"}).status_code == 200


def test_allowed_hosts_patterns_are_checked():
    with pytest.raises(ValueError, match="^allowed_hosts: "):
        ServerSettings(allowed_hosts=("evil.*",))
