"""vLLM's request surface through the official openai client on the real server: tool calls parsed from
model-format text by each parser (the text forced by a structured_outputs regex), structured_outputs on both
endpoints, chat_template_kwargs reaching the template, reasoning split from content, continuous usage stats, CORS,
and vLLM keys this server cannot honour refused by name."""

import json
from collections.abc import Iterator
from typing import Any, Optional

import httpx
import openai
import pytest

from jaxpaged.sampling.params import StructuredOutputsParams
from jaxpaged.server import ServerSettings, build_app
from jaxpaged.server.openai.chat_template import check_chat_template
from jaxpaged.server.openai.protocol import CompletionRequest
from jaxpaged.server.openai.validation import structured_outputs_of
from tests.server.call_fragments import merged_calls
from tests.server.server_helpers import ServerThread
from tests.server.test_tool_parsers import FIXTURES

pytestmark = pytest.mark.xdist_group("server")

THINKING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{%- endif %}")
"""A Qwen3-like template: enable_thinking=false closes an empty reasoning block in the prompt."""
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
         for name in ("get_weather", "get_time")]
ASK = [{"role": "user", "content": "Weather in Paris, and the time in CET?"}]
_REGEX_SPECIAL = set("\\.^$|?*+()[]{}")


def literal_regex(text: str) -> str:
    """A regular expression that matches exactly `text`."""
    return "".join("\\" + char if char in _REGEX_SPECIAL else char for char in text)


@pytest.fixture(scope="module")
def servers(async_engine) -> Iterator[dict[str, ServerThread]]:
    """One app per tool parser, one thinking app (qwen3 reasoning, a template with enable_thinking) and one with
    CORS, all on the session's engine."""
    settings = {name: ServerSettings(tool_call_parser=name, enable_auto_tool_choice=True) for name in FIXTURES
                if name != "llama3_json"}  # llama3_json: the vLLM launch line test serves it
    # The reasoning test forces the model's text with a regex over the whole output, reasoning included
    # (--structured-outputs-config '{"enable_in_reasoning": true}'); by default a grammar starts after </think>.
    settings["thinking"] = ServerSettings(reasoning_parser="qwen3", chat_template=THINKING_TEMPLATE,
                                          tool_call_parser="hermes", structured_outputs_in_reasoning=True)
    settings["cors"] = ServerSettings(allowed_origins=("https://ui.example",), allow_credentials=True)
    running = {name: ServerThread(build_app(async_engine, value)).__enter__() for name, value in settings.items()}
    yield running
    for server in running.values():
        server.__exit__(None, None, None)


def _client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat(server: ServerThread, model_name: str, stream: bool, **extra: Any) -> tuple[dict, Optional[str]]:
    """The message (content, reasoning, tool calls) and finish reason, whole or gathered from a stream."""
    client = _client(server)
    kwargs: dict[str, Any] = dict(model=model_name, messages=ASK, max_completion_tokens=150, temperature=0.0, **extra)
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        message = choice.message.model_dump()
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"] or []]
        return {"content": message["content"], "reasoning": message.get("reasoning"),
                "calls": calls}, choice.finish_reason
    content, reasoning, entries, finish = "", "", [], None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        delta = chunk.choices[0].delta.model_dump()
        content += delta.get("content") or ""
        reasoning += delta.get("reasoning") or ""
        entries += [chunk_entry.model_dump(exclude_none=True)
                    for chunk_entry in chunk.choices[0].delta.tool_calls or []]
        finish = chunk.choices[0].finish_reason or finish
    calls = [(call["name"], json.loads(call["arguments"])) for call in merged_calls(entries)]
    return {"content": content.rstrip() or None, "reasoning": reasoning or None, "calls": calls}, finish


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("parser", [name for name in FIXTURES if name != "llama3_json"])
def test_auto_tool_calls_are_parsed_from_model_format_text(servers, model_name, parser, stream):
    text, content, calls = FIXTURES[parser]
    message, finish = _chat(servers[parser], model_name, stream, tools=TOOLS, tool_choice="auto",
                            extra_body={"structured_outputs": {"regex": literal_regex(text)}})
    assert finish == "tool_calls"
    assert message["calls"] == calls and message["content"] == content


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_is_split_from_content(servers, model_name, stream):
    text = "<think>\nParis is in France.\n</think>\n\nIt is sunny."
    message, finish = _chat(servers["thinking"], model_name, stream,
                            extra_body={"structured_outputs": {"regex": literal_regex(text)}})
    assert finish == "stop"
    assert message["reasoning"] == "\nParis is in France.\n"
    assert message["content"].strip() == "It is sunny."


def test_enable_thinking_false_reaches_the_template(servers, http):
    base = servers["thinking"].base_url

    def rendered(kwargs: dict) -> str:
        tokens = httpx.post(base + "/tokenize", json={"messages": ASK, "chat_template_kwargs": kwargs}).json()
        return httpx.post(base + "/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]

    assert rendered({"enable_thinking": False}).endswith("<think>\n\n</think>\n\n")
    assert not rendered({}).endswith("</think>\n\n")


def test_structured_outputs_constrain_chat_and_completions(client, model_name):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    chat = client.chat.completions.create(model=model_name, messages=ASK, max_completion_tokens=40, temperature=0.0,
                                          extra_body={"structured_outputs": {"json": schema}})
    assert json.loads(chat.choices[0].message.content)["city"] in ("Paris", "Rome")
    for constraint, check in (({"choice": ["yes", "no"]}, lambda text: text in ("yes", "no")),
                              ({"regex": "[0-9]{3}-[0-9]{4}"}, lambda text: len(text) == 8 and text[3] == "-"),
                              ({"grammar": 'start: "ab" | "cd"'}, lambda text: text in ("ab", "cd"))):
        text = client.completions.create(model=model_name, prompt="Answer:", max_tokens=60, temperature=0.0,
                                         extra_body={"structured_outputs": constraint}).choices[0].text
        assert check(text), (constraint, text)
    # json_object is response_format's {"type": "json_object"} (test_structured_outputs_api.py runs that one).
    request = CompletionRequest.model_validate({"prompt": "x", "structured_outputs": {"json_object": True}})
    assert structured_outputs_of(request) == StructuredOutputsParams(json_object=True)


@pytest.mark.parametrize("body, param", [
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "guided_choice": ["b"]}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"logits_processors": ["x"]}, "logits_processors"),
    ({"chat_template": "{{ x }}"}, "chat_template"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
    ({"continue_final_message": True}, "continue_final_message"),  # with add_generation_prompt (the default)
])
def test_bad_or_unhonoured_vllm_keys_are_refused_by_name(http, model_name, body, param):
    response = http.post("/v1/chat/completions", json={"model": model_name, "messages": ASK, "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_vllm_keys_at_their_off_values_pass(http, model_name):
    body = {"model": model_name, "messages": ASK, "max_tokens": 2, "use_beam_search": False, "length_penalty": 1,
            "spaces_between_special_tokens": True, "prompt_logprobs": None, "reasoning_effort": "low"}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    response = http.post("/v1/completions", json={"model": model_name, "prompt": "Hi", "max_tokens": 2,
                                                  "prompt_embeds": "AAAA"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt_embeds"


def test_continue_final_message_ends_the_prompt_inside_the_last_message(http, model_name):
    messages = [*ASK, {"role": "assistant", "content": "The weather in Paris is"}]

    def prompt_tokens(**keys: Any) -> int:
        response = http.post("/v1/chat/completions", json={"model": model_name, "messages": messages,
                                                           "max_tokens": 1, "add_generation_prompt": False, **keys})
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]

    assert prompt_tokens(continue_final_message=True) < prompt_tokens()  # no end-of-turn tokens after "is"


@pytest.mark.parametrize("chat", [True, False])
def test_continuous_usage_stats_count_each_choice_so_far(client, model_name, chat):
    options = {"include_usage": True, "continuous_usage_stats": True}
    if chat:
        chunks = list(client.chat.completions.create(model=model_name, messages=ASK, max_completion_tokens=5,
                                                     temperature=0.0, stream=True, stream_options=options,
                                                     extra_body={"ignore_eos": True}))
    else:
        chunks = list(client.completions.create(model=model_name, prompt="Once upon", max_tokens=5, stream=True,
                                                stream_options=options, extra_body={"ignore_eos": True}))
    counts = [chunk.usage.completion_tokens for chunk in chunks if chunk.choices]
    assert all(chunk.usage is not None for chunk in chunks)
    assert counts == sorted(counts) and counts[-1] == 5
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == chunks[0].usage.prompt_tokens


def test_cors_answers_a_browser_preflight(servers):
    headers = {"Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization,content-type"}
    response = httpx.options(servers["cors"].base_url + "/v1/chat/completions", headers=headers)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://ui.example"
    assert response.headers["access-control-allow-credentials"] == "true"
    other = httpx.options(servers["cors"].base_url + "/v1/models", headers={**headers, "Origin": "https://evil.test"})
    assert "access-control-allow-origin" not in other.headers


def test_a_chat_template_that_fails_to_render_stops_the_start_up(async_engine):
    check_chat_template(async_engine.tokenizer, THINKING_TEMPLATE)
    for template in ("{% if %}", "{{ raise_exception('no system messages') }}"):
        with pytest.raises(ValueError, match="^chat_template: --chat-template does not render"):
            check_chat_template(async_engine.tokenizer, template)
