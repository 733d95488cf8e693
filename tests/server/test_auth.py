"""--api-key: /v1/*, /tokenize, /detokenize and /metrics need `Authorization: Bearer <key>`; /health and /version
stay open; the key never shows in logs or errors."""

import logging

import httpx
import openai
import pytest

from jaxpaged.server.context import ServerSettings
from jaxpaged.server.http.auth import BearerAuthMiddleware
from tests.server.server_helpers import API_KEY

pytestmark = pytest.mark.xdist_group("server")

PROTECTED = [("GET", "/v1/models", None), ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1}),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
             ("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1]})]


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", f"Bearer {API_KEY}x", API_KEY, f"bearer  {API_KEY}",
                                    "Basic dXNlcjpwYXNz"], ids=["none", "wrong", "longer", "no-scheme",
                                                                "bad-scheme", "basic"])
def test_protected_routes_need_the_key(auth_server, header):
    """Anything but the exact bearer key gets 401 with the OpenAI error body, on every protected route."""
    headers = {} if header is None else {"Authorization": header}
    with httpx.Client(base_url=auth_server.base_url, timeout=30) as client:
        for method, path, body in PROTECTED:
            response = client.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, path
            assert response.json()["error"]["type"] == "authentication_error"
            assert response.headers["www-authenticate"] == "Bearer"
            assert API_KEY not in response.text


def test_right_key_works_and_probes_stay_open(auth_server, model_name, caplog):
    """The openai client with the key is served; /health and /version need no key, /metrics does; no log shows
    it."""
    caplog.set_level(logging.DEBUG)
    client = openai.OpenAI(base_url=auth_server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert [model.id for model in client.models.list()] == [model_name]
    result = client.completions.create(model=model_name, prompt="hi", max_tokens=2)
    assert result.usage is not None and result.usage.completion_tokens >= 1
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2)
    assert chat.choices[0].message.role == "assistant"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=auth_server.base_url + "/v1", api_key="nope", max_retries=0).models.list()
    with httpx.Client(base_url=auth_server.base_url, timeout=30) as plain:
        assert plain.get("/health").status_code == 200
        assert plain.get("/metrics").status_code == 401
        assert plain.get("/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
        assert plain.get("/version").status_code == 200
        tokens = plain.post("/tokenize", json={"prompt": "hi"}, headers={"Authorization": f"Bearer {API_KEY}"})
        assert tokens.status_code == 200
    assert API_KEY not in caplog.text


def test_key_hidden_from_repr_and_compared_by_digest():
    """ServerSettings' repr hides the key; the check accepts only the exact header value."""
    settings = ServerSettings(api_key=API_KEY)
    assert API_KEY not in repr(settings) and "<set>" in repr(settings)
    middleware = BearerAuthMiddleware(app=None, api_key=API_KEY)  # pyright: ignore[reportArgumentType]  (no app needed)
    assert middleware.is_authorized(f"Bearer {API_KEY}".encode())
    assert not middleware.is_authorized(f"Bearer {API_KEY[:-1]}".encode())
    assert not middleware.is_authorized(b"")
