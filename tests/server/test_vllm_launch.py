"""`jaxpaged serve` started with a vLLM launch line (positional model, --served-model-name x y,
--enable-auto-tool-choice --tool-call-parser llama3_json, --config, vLLM flags that mean nothing here) and driven
with the official openai client: the names, max_model_len defaulting to the model's context (lowered to the pool),
llama3_json tool calls streamed and not, vllm:* metrics with model_name, and the start-up log."""

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA
from tests.server.call_fragments import merged_calls
from tests.server.test_tool_parsers import FIXTURES
from tests.server.test_vllm_requests import literal_regex

pytestmark = pytest.mark.xdist_group("tiny_llm")

START_TIMEOUT_S = 300
POOL_TOKENS = (TINY_ENGINE_OPTIONS["num_kv_blocks"] - 1) * 16
"""What the --config pool holds for one sequence: less than the tiny model's 1,024-token context."""


class LaunchedServer:
    def __init__(self, base_url: str, process: subprocess.Popen, log_path) -> None:
        self.base_url, self.process, self.log_path = base_url, process, log_path

    @property
    def log(self) -> str:
        return self.log_path.read_text()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_style_server(tiny_model_dir, tmp_path_factory) -> Iterator[LaunchedServer]:
    """The server as a vLLM user launches it; stops with SIGTERM (and must exit 0)."""
    directory = tmp_path_factory.mktemp("vllm-launch")
    config = directory / "engine.yaml"
    options = {key: value for key, value in TINY_ENGINE_OPTIONS.items() if key != "max_model_len"}
    # vLLM's --config holds serve flags too: the tool-call parser comes from the file.
    config.write_text(yaml.safe_dump({**{key.replace("_", "-"): value for key, value in options.items()},
                                      "tool-call-parser": "llama3_json"}))
    port = _free_port()
    log_path = directory / "server.log"
    command = [sys.executable, "-m", "jaxpaged.cli", "serve", str(tiny_model_dir), "--served-model-name", "x", "y",
               "--enable-auto-tool-choice", "--config", str(config), "--max-model-len", "auto",
               "--port", str(port), "--trust-remote-code", "--disable-log-requests", "--gpu-memory-utilization",
               "0.9", "--enable-chunked-prefill", "--dtype", "float", "--enable-log-requests"]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = LaunchedServer(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=2) as client:  # one client: httpx.get builds an SSL context per call (~23 ms of CPU)
        while True:
            assert process.poll() is None, f"the server exited {process.returncode}:\n{server.log[-3000:]}"
            assert time.monotonic() < deadline, f"the server did not start:\n{server.log[-3000:]}"
            try:
                if client.get(server.base_url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    yield server
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0, server.log[-3000:]


@pytest.fixture
def launched_client(vllm_style_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_style_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_every_served_name_and_the_fitted_context(launched_client):
    models = launched_client.models.list().data
    assert [model.id for model in models] == ["x", "y"]
    assert {model.model_extra["max_model_len"] for model in models} == {POOL_TOKENS}


def test_a_request_may_name_any_served_name_and_the_response_names_the_first(launched_client):
    response = launched_client.completions.create(model="y", prompt="Hello", max_tokens=2)
    assert response.model == "x"
    with pytest.raises(openai.NotFoundError):
        launched_client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=2)


@pytest.mark.parametrize("stream", [False, True])
def test_llama3_json_tool_calls_are_parsed(launched_client, stream):
    text, _, expected = FIXTURES["llama3_json"]
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
             for name in ("get_weather", "get_time")]
    kwargs = dict(model="x", messages=[{"role": "user", "content": "Weather?"}], tools=tools, tool_choice="auto",
                  max_completion_tokens=120, extra_body={"structured_outputs": {"regex": literal_regex(text)}})
    if stream:
        entries, finish = [], None
        for chunk in launched_client.chat.completions.create(**kwargs, stream=True):
            entries += [entry.model_dump(exclude_none=True) for entry in chunk.choices[0].delta.tool_calls or []]
            finish = chunk.choices[0].finish_reason or finish
        parsed = [(call["name"], json.loads(call["arguments"])) for call in merged_calls(entries)]
    else:
        choice = launched_client.chat.completions.create(**kwargs).choices[0]
        parsed = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
        finish = choice.finish_reason
        assert choice.message.content is None
    assert finish == "tool_calls" and parsed == expected


def test_metrics_carry_vllm_names_with_the_model_name(vllm_style_server, launched_client):
    launched_client.completions.create(model="x", prompt="Count", max_tokens=3, extra_body={"ignore_eos": True})
    text = httpx.get(vllm_style_server.base_url + "/metrics").text
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    label = (("engine", "0"), ("model_name", "x"))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert samples[(name, label)] == 0.0
    for name in ("vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert samples[(name, label)] >= 0, name
    assert samples[("vllm:generation_tokens_total", label)] >= 3
    assert samples[("vllm:prompt_tokens_total", label)] == samples[("jaxpaged_prompt_tokens_total", ())]
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count"):
        assert samples[(name, label)] >= 1, name
    assert samples[("vllm:inter_token_latency_seconds_count", label)] >= 2
    assert samples[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "length"),
                                                   ("model_name", "x")))] >= 1


def test_the_request_log_has_one_line_per_request(vllm_style_server, launched_client):
    """--enable-log-requests: the request's id, prompt length and sampling parameters, once."""
    response = launched_client.completions.create(model="x", prompt="Logged", max_tokens=2)
    lines = [line for line in vllm_style_server.log.splitlines() if f"Received request {response.id}" in line]
    assert len(lines) == 1 and "prompt tokens: " in lines[0] and "max_tokens=2" in lines[0]


def test_the_start_up_log_says_what_was_decided(vllm_style_server):
    log = vllm_style_server.log
    assert f"max_model_len: {TINY_LLAMA['max_position_embeddings']} (the model's context length) lowered to " \
           f"{POOL_TOKENS}" in log
    assert "--trust-remote-code: vLLM's flag is accepted and ignored" in log
    assert "--disable-log-requests: vLLM's flag is accepted and ignored" in log
    assert "start-up plan: devices" in log and "serving x on http://" in log
    assert "127.0.0.1 is loopback only" in log
    assert "--enable-chunked-prefill: vLLM's flag is accepted and changes nothing here" in log
    # At the default level (no --log-level on the line): the dtype and the memory plan.
    assert "\n  dtype float32; layers " in log and "memory plan per device: weights " in log
