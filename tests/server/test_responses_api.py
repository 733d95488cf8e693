"""POST /v1/responses through the official openai client: the same greedy text and token counts as the chat
endpoint for the same conversation (the reference), OpenAI's stream of typed events adding up to the response,
function tools, structured text, the conversation's items, and 400s that name the Responses field."""

import json
from typing import Any

import jsonschema
import openai
import pytest

from jaxpaged.server.openai.responses_input import input_messages

pytestmark = pytest.mark.xdist_group("server")

ASK = "What is the capital of France?"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER}


def _chat(client, messages, max_tokens: int = 12):
    return client.chat.completions.create(model=client.model_name, messages=messages, max_completion_tokens=max_tokens,
                                          temperature=0.0)


@pytest.fixture
def responses_client(client, model_name) -> openai.OpenAI:
    client.model_name = model_name  # type: ignore[attr-defined]
    return client


def test_text_output_and_usage_match_the_chat_endpoint(responses_client, model_name):
    """A greedy response's output_text and token counts are the chat completion's for the same messages;
    `instructions` is the system message."""
    response = responses_client.responses.create(model=model_name, input=ASK, instructions="Answer briefly.",
                                                 max_output_tokens=12, temperature=0.0)
    chat = _chat(responses_client, [{"role": "system", "content": "Answer briefly."},
                                    {"role": "user", "content": ASK}])
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.usage is not None and chat.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                           chat.usage.completion_tokens)
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")


def test_the_stream_s_events_add_up_to_the_response(responses_client, model_name):
    """Streamed: created and in_progress first, the text deltas in order (their concatenation is the done text and
    the final output), sequence numbers counting up, and a response.incomplete naming max_output_tokens last."""
    events = list(responses_client.responses.create(model=model_name, input=ASK, max_output_tokens=6,
                                                    temperature=0.0, stream=True, extra_body={"ignore_eos": True}))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta")
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    done: Any = next(event for event in events if event.type == "response.output_text.done")
    final: Any = events[-1].response
    assert deltas == done.text == final.output_text
    assert final.incomplete_details.reason == "max_output_tokens" and final.usage.output_tokens == 6
    whole = responses_client.responses.create(model=model_name, input=ASK, max_output_tokens=6, temperature=0.0,
                                              extra_body={"ignore_eos": True})
    assert whole.output_text == deltas


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_function_call_comes_back_as_a_function_call_item(responses_client, model_name, stream):
    """tool_choice "required": a function_call item whose arguments follow the tool's schema, whole or streamed
    (the argument deltas add up to the done arguments)."""
    kwargs: dict[str, Any] = dict(model=model_name, input="What is the weather like in Paris?", tools=[TOOL],
                                  tool_choice="required", max_output_tokens=60, temperature=0.0)
    if stream:
        events = list(responses_client.responses.create(**kwargs, stream=True))
        deltas = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
        done: Any = next(event for event in events if event.type == "response.function_call_arguments.done")
        assert deltas == done.arguments and done.name == "get_weather"
        output: Any = events[-1].response.output  # type: ignore[union-attr]
    else:
        output = responses_client.responses.create(**kwargs).output
    calls = [item for item in output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_json_schema_text_format_constrains_the_output(responses_client, model_name):
    """text.format json_schema: the output text is JSON that validates."""
    response = responses_client.responses.create(
        model=model_name, input="Give me a city.", max_output_tokens=40, temperature=0.0,
        text={"format": {"type": "json_schema", "name": "city", "schema": WEATHER, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), WEATHER)


def test_conversation_items_render_as_the_chat_messages_they_are(responses_client, model_name):
    """An earlier function call and its output in `input` make the same prompt as the chat messages with
    tool_calls and a tool message (equal input_tokens)."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}]
    response = responses_client.responses.create(model=model_name, input=items, max_output_tokens=4,
                                                 temperature=0.0)  # type: ignore[arg-type]
    chat = _chat(responses_client, input_messages(items), max_tokens=4)
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.output_text == chat.choices[0].message.content


def test_items_read_into_chat_messages():
    """Hand-worked: developer is system, consecutive calls join one assistant message, reasoning items drop."""
    items = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"type": "reasoning", "summary": []},
             {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
             {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "a", "output": [{"type": "input_text", "text": "1"}]}]
    messages = input_messages(items)
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "tool"]
    assert [call["id"] for call in messages[2]["tool_calls"]] == ["a", "b"]
    assert messages[3] == {"role": "tool", "tool_call_id": "a", "content": "1"}


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "computer_call"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": []}, "input"),
])
def test_what_cannot_work_is_a_400_naming_the_responses_field(http, model_name, body, param):
    """Stateless, function tools only, text parts only: each refusal names the field the client sent."""
    response = http.post("/v1/responses", json={"model": model_name, "max_output_tokens": 2, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
