"""A streamed "auto" tool call over HTTP through the official openai client (issue 61, item 7): the hermes server's
model is held to one call's text by a structured output, so the call is certain; the stream's entries have vLLM's
shape and add up to the non-streamed response's call."""

from typing import Any

import openai
import pytest

from tests.server.call_fragments import merged_calls

pytestmark = pytest.mark.xdist_group("server")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}}}}}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_an_auto_call_streams_its_arguments_in_fragments(hermes_server, model_name):
    """Streamed: a first entry with id, type and name, then argument fragments (more than one) that concatenate to
    the arguments of the non-streamed response; both finish with "tool_calls" and carry no content."""
    client = openai.OpenAI(base_url=hermes_server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    kwargs: dict[str, Any] = dict(model=model_name, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                  tools=TOOLS, tool_choice="auto", max_completion_tokens=100, temperature=0.0,
                                  extra_body={"structured_outputs": {"choice": [CALL_TEXT]}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls and not whole.message.content
    entries, content, finish = [], "", None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            entries += [entry.model_dump(exclude_none=True) for entry in delta.tool_calls or []]
            finish = chunk.choices[0].finish_reason or finish
    streamed = merged_calls(entries)
    assert [(c["name"], c["arguments"]) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == \
        [("get_weather", '{"city": "Paris"}')]
    assert len(entries) > 2 and finish == "tool_calls" and not content
