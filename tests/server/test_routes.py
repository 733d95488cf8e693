"""The small routes (/v1/models, /version, /health, /tokenize, /detokenize) and 503 while draining."""

import httpx
import pytest

import jaxpaged
from jaxpaged.server import ServerSettings, build_app
from tests.server.server_helpers import ServerThread

pytestmark = pytest.mark.xdist_group("server")


def test_models_version_health(http, model_name):
    """/v1/models lists the served model with its max_model_len; /version and /health answer."""
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(card["id"], card["object"], card["max_model_len"]) for card in models["data"]] == \
        [(model_name, "model", 512)]
    assert http.get("/version").json() == {"version": jaxpaged.__version__}
    assert http.get("/health").status_code == 200


def test_tokenize_detokenize_round_trip(http):
    """/tokenize counts tokens (text or chat messages); /detokenize gives the text back."""
    tokens = http.post("/tokenize", json={"prompt": "Paged attention, the JAX way."}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 512
    text = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "Paged attention, the JAX way."
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    with_prompt = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert "hi" in with_prompt and chat["count"] > 3


def test_draining_app_refuses_with_503(async_engine, model_name):
    """Once draining (SIGTERM), /health and new requests get 503 with the OpenAI body; probes stay reachable."""
    app = build_app(async_engine, ServerSettings())
    with ServerThread(app) as running, httpx.Client(base_url=running.base_url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        app.state.context.draining = True
        assert client.get("/health").status_code == 503
        refused = client.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 1})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "server_shutting_down"
        assert client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
                           ).status_code == 503
        assert client.get("/metrics").status_code == 200
