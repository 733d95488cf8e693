"""The server's LoRA adapters as vLLM serves them: --lora-modules at start-up, adapter names as `model` and in
/v1/models with their parent, runtime load and unload (behind the opt-in), a bad adapter refused with a 400 naming
it while the others keep serving, and vllm:lora_requests_info."""

from collections.abc import Iterator

import httpx
import pytest

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.server import ServerSettings, build_app
from jaxpaged.server.vllm.lora_modules import LoRAModule, parse_lora_module
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA
from tests.lora.peft_files import write_peft_adapter
from tests.server.server_helpers import ServerThread, wait_until_idle

PROMPT = [1, 400, 401, 402, 403, 404, 405, 406]


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    """Two good adapters, one of rank 16 (above the server's max_lora_rank 8), one with a wrong-shaped tensor."""
    root = tmp_path_factory.mktemp("server-adapters")
    write_peft_adapter(root / "startup", TINY_LLAMA, rank=4, alpha=8.0, targets=["q_proj", "v_proj", "down_proj"],
                       seed=7)
    write_peft_adapter(root / "late", TINY_LLAMA, rank=8, alpha=8.0, targets=["o_proj", "up_proj"], seed=8)
    write_peft_adapter(root / "too-big", TINY_LLAMA, rank=16, alpha=16.0, targets=["q_proj"], seed=9)
    write_peft_adapter(root / "bad-shape", dict(TINY_LLAMA, hidden_size=32, head_dim=8), rank=4, alpha=4.0,
                       targets=["q_proj"], seed=10)
    return root


@pytest.fixture(scope="module")
def lora_server(tiny_model_dir, adapter_dirs, monkeypatch_module) -> Iterator[tuple[ServerThread, AsyncLLMEngine]]:
    from jaxpaged.engine import LLMEngine

    monkeypatch_module.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    engine = AsyncLLMEngine(LLMEngine.from_options(str(tiny_model_dir), enable_lora=True, max_loras=2,
                                                   max_lora_rank=8, **TINY_ENGINE_OPTIONS))
    engine.start()
    settings = ServerSettings(lora_modules=(LoRAModule("startup", str(adapter_dirs / "startup")),))
    try:
        with ServerThread(build_app(engine, settings)) as running:
            yield running, engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def complete(server: ServerThread, model: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                      json={"model": model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "ignore_eos": True})


def test_lora_module_forms_parse():
    """--lora-modules takes name=path and vLLM's JSON object; a malformed entry names the flag."""
    assert parse_lora_module("sql=/a/b") == LoRAModule("sql", "/a/b")
    assert parse_lora_module('{"name": "sql", "path": "/a", "base_model_name": "m"}') == LoRAModule("sql", "/a", "m")
    for bad in ("sql", "=/a", '{"name": "sql"}', "{not json"):
        with pytest.raises(ValueError, match="--lora-modules"):
            parse_lora_module(bad)


def test_startup_adapter_is_a_model_with_its_parent(lora_server):
    """/v1/models lists the --lora-modules adapter with the base model as parent; naming it changes the tokens and
    the response's model is the adapter's name."""
    server, engine = lora_server
    cards = {card["id"]: card for card in httpx.get(f"{server.base_url}/v1/models").json()["data"]}
    assert cards["startup"]["parent"] == engine.model_name
    base, adapted = complete(server, engine.model_name), complete(server, "startup")
    assert base.status_code == adapted.status_code == 200, adapted.text
    assert adapted.json()["model"] == "startup"
    assert adapted.json()["choices"][0]["text"] != base.json()["choices"][0]["text"]
    assert complete(server, "no-such-adapter").status_code == 404
    wait_until_idle(engine)


def test_load_and_unload_while_serving(lora_server, adapter_dirs):
    """An adapter loaded at run time serves at once, beside the start-up one; unloaded, its name is a 404 again
    and the start-up adapter still answers as before."""
    server, engine = lora_server
    before = complete(server, "startup").json()["choices"][0]["text"]
    loaded = httpx.post(f"{server.base_url}/v1/load_lora_adapter",
                        json={"lora_name": "late", "lora_path": str(adapter_dirs / "late")})
    assert loaded.status_code == 200, loaded.text
    assert "late" in {card["id"] for card in httpx.get(f"{server.base_url}/v1/models").json()["data"]}
    assert complete(server, "late").status_code == 200
    again = httpx.post(f"{server.base_url}/v1/load_lora_adapter",
                       json={"lora_name": "late", "lora_path": str(adapter_dirs / "late")})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    unloaded = httpx.post(f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": "late"})
    assert unloaded.status_code == 200, unloaded.text
    assert complete(server, "late").status_code == 404
    assert httpx.post(f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code == 404
    assert complete(server, "startup").json()["choices"][0]["text"] == before
    wait_until_idle(engine)


@pytest.mark.parametrize("name, field", [("too-big", "r: 16 is above max_lora_rank"),
                                         ("bad-shape", "has shape"), ("missing", "lora_path")])
def test_bad_adapter_is_a_400_naming_it_and_others_keep_serving(lora_server, adapter_dirs, name, field):
    """A rank above max_lora_rank, a tensor of the wrong shape or a missing directory: 400 naming the adapter and
    the field; the adapter is not served, and the start-up adapter still is."""
    server, engine = lora_server
    response = httpx.post(f"{server.base_url}/v1/load_lora_adapter",
                          json={"lora_name": name, "lora_path": str(adapter_dirs / name)})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert repr(name) in message and field in message, message
    assert complete(server, name).status_code == 404
    assert complete(server, "startup").status_code == 200
    wait_until_idle(engine)


def test_lora_requests_info_gauge(lora_server):
    """/metrics carries vllm:lora_requests_info with vLLM's labels (max_lora, waiting and running adapters)."""
    server, engine = lora_server
    complete(server, "startup")
    wait_until_idle(engine)
    text = httpx.get(f"{server.base_url}/metrics").text
    line = next(line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{"))
    assert 'max_lora="2"' in line and 'running_lora_adapters=""' in line and 'waiting_lora_adapters=""' in line
