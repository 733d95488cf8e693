"""Tool calls through the official openai client: a named function and tool_choice "required", streamed and not;
the arguments follow each function's JSON schema."""

import json
from typing import Any, Optional

import jsonschema
import openai
import pytest

from tests.server.call_fragments import merged_calls

pytestmark = pytest.mark.xdist_group("server")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["timezone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def collect_stream(chunks) -> tuple[list[dict], Optional[str]]:
    """Tool calls accumulated from streamed deltas (OpenAI's rules: by index, arguments concatenated)."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": None, "arguments": ""})
            if delta.function.name:
                call["name"] = delta.function.name
            call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True])
def test_named_function_is_called_with_valid_arguments(client, model_name, stream):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kwargs: dict[str, Any] = dict(model=model_name, messages=ASK, tools=TOOLS, tool_choice=choice,
                                  max_completion_tokens=60, temperature=0.0)
    if stream:
        calls, finish = collect_stream(client.chat.completions.create(**kwargs, stream=True))
    else:
        message = client.chat.completions.create(**kwargs).choices[0]
        assert message.message.content is None
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.message.tool_calls]
        finish = message.finish_reason
    assert finish == "stop" and [call["name"] for call in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_returns_tool_calls(client, model_name, stream):
    kwargs: dict[str, Any] = dict(model=model_name, messages=ASK, tools=TOOLS, tool_choice="required",
                                  max_completion_tokens=120, temperature=0.0)
    if stream:
        calls, finish = collect_stream(client.chat.completions.create(**kwargs, stream=True))
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls]
        assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls)
        finish = choice.finish_reason
    assert finish == "tool_calls" and calls
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_tool_choice_none_answers_in_text(client, model_name):
    choice = client.chat.completions.create(model=model_name, messages=ASK, tools=TOOLS, tool_choice="none",
                                            max_completion_tokens=8, temperature=0.0).choices[0]
    assert choice.message.content and not choice.message.tool_calls


@pytest.mark.parametrize("tool_choice, tools, param", [
    ({"type": "function", "function": {"name": "nope"}}, TOOLS, "tool_choice"),
    ("auto", TOOLS, "tool_choice"),
    ("required", None, "tool_choice"),
])
def test_tool_choice_that_cannot_work_is_a_400(client, model_name, tool_choice, tools, param):
    kwargs = {"tools": tools} if tools else {}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model_name, messages=ASK, tool_choice=tool_choice,
                                       max_completion_tokens=8, **kwargs)
    body: Any = raised.value.body
    assert body["param"] == param


@pytest.mark.parametrize("stream", [False, True])
def test_auto_with_the_hermes_parser_answers_in_text_or_calls(hermes_server, model_name, stream):
    """The model decides; either way the response is well formed (calls name a tool and carry JSON arguments)."""
    client = openai.OpenAI(base_url=hermes_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    kwargs: dict[str, Any] = dict(model=model_name, messages=ASK, tools=TOOLS, tool_choice="auto",
                                  max_completion_tokens=40, temperature=0.0)
    if stream:
        pieces, entries, finish = [], [], None
        for chunk in client.chat.completions.create(**kwargs, stream=True):
            if chunk.choices:
                delta = chunk.choices[0].delta
                pieces.append(delta.content or "")
                entries += [entry.model_dump(exclude_none=True) for entry in delta.tool_calls or []]
                finish = chunk.choices[0].finish_reason or finish
        text = "".join(pieces)
        calls = [{"name": c["name"], "arguments": c["arguments"]} for c in merged_calls(entries)]
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        text, finish = choice.message.content or "", choice.finish_reason
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in choice.message.tool_calls or []]
    if calls:
        assert finish == "tool_calls" and all(c["name"] in SCHEMAS for c in calls)
        assert all(isinstance(json.loads(c["arguments"]), dict) for c in calls)
    else:
        assert finish in ("stop", "length") and text and "<tool_call>" not in text


def test_unknown_named_tool_error_lists_few_names_cut_short():
    """An unknown tool_choice name lists at most 10 of the tools' names, each cut to 32 characters, and how many
    more: a request with thousands of 64-character names must not get them all echoed back."""
    from jaxpaged.server.http.errors import APIError
    from jaxpaged.server.openai.protocol import ChatCompletionRequest
    from jaxpaged.server.openai.tool_calls import tool_calling

    names = [f"tool_{i:04d}_" + "x" * 54 for i in range(2000)]
    request = ChatCompletionRequest.model_validate({
        "messages": ASK, "tools": [{"type": "function", "function": {"name": name}} for name in names],
        "tool_choice": {"type": "function", "function": {"name": "missing"}}})
    with pytest.raises(APIError) as raised:
        tool_calling(request)
    message = raised.value.message
    assert raised.value.param == "tool_choice" and len(message) < 600
    assert "tool_0009_" in message and "tool_0010_" not in message and names[0] not in message
    assert message.endswith("and 1990 more)")
