"""OpenAI's parallel_tool_calls and reasoning_effort and vLLM's tool_choice "none" prompt, on the pieces that carry
them (no server: the behaviour lives in ToolCalling, ChoiceText and ServerSettings)."""

from jaxpaged.server.context import ServerSettings
from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.protocol import ChatCompletionRequest
from jaxpaged.server.openai.tool_calls import prompt_tools, tool_calling
from jaxpaged.server.parsers.tool import HermesToolParser
from tests.server.call_fragments import merged_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>')


def _request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "tools": TOOLS, **fields})


def test_parallel_tool_calls_false_keeps_the_first_auto_call_whole_and_streamed():
    """parallel_tool_calls false: a text with two calls returns only the first, whole and in the stream."""
    calling = tool_calling(_request(tool_choice="auto", parallel_tool_calls=False), HermesToolParser())
    assert calling is not None
    assert [call["function"]["name"] for call in calling.calls(TWO_CALLS)] == ["get_weather"]
    text = ChoiceText(calling, None, False)
    streamed = merged_calls([call for end in range(1, len(TWO_CALLS) + 1)
                             for call in text.delta(TWO_CALLS[:end], end == len(TWO_CALLS)).get("tool_calls", [])])
    assert [(call["name"], call["arguments"]) for call in streamed] == \
        [(call["function"]["name"], call["function"]["arguments"]) for call in calling.calls(TWO_CALLS)]


def test_parallel_tool_calls_default_returns_every_call():
    """Without parallel_tool_calls (true by default) both calls come back, in order."""
    calling = tool_calling(_request(tool_choice="auto"), HermesToolParser())
    assert calling is not None
    assert [call["function"]["name"] for call in calling.calls(TWO_CALLS)] == ["get_weather", "get_time"]


def test_required_with_parallel_tool_calls_false_holds_one_call_in_its_grammar():
    """tool_choice "required" with parallel_tool_calls false: the array grammar allows exactly one call."""
    one_call, many_calls = (tool_calling(_request(tool_choice="required", parallel_tool_calls=False)),
                            tool_calling(_request(tool_choice="required")))
    assert one_call is not None and many_calls is not None
    one, many = one_call.constraint(), many_calls.constraint()
    assert one is not None and many is not None and isinstance(one.json, dict) and isinstance(many.json, dict)
    assert (one.json["minItems"], one.json["maxItems"]) == (1, 1) and "maxItems" not in many.json


def test_tool_choice_none_keeps_the_tools_in_the_prompt_unless_excluded():
    """tool_choice "none" answers in text but the template still shows the tools (vLLM's default);
    --exclude-tools-when-tool-choice-none leaves them out; no tools stays no tools."""
    request = _request(tool_choice="none")
    assert tool_calling(request) is None
    assert [tool["function"]["name"] for tool in prompt_tools(request, None) or []] == ["get_weather", "get_time"]
    assert prompt_tools(request, None, exclude_when_none=True) is None
    no_tools = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert prompt_tools(no_tools, None) is None


def test_reasoning_effort_reaches_the_chat_template_unless_the_request_sets_it():
    """reasoning_effort joins the template kwargs; the request's own chat_template_kwargs value wins."""
    settings = ServerSettings(default_chat_template_kwargs={"enable_thinking": True})
    assert settings.chat_template_kwargs_for(None, "low") == {"enable_thinking": True, "reasoning_effort": "low"}
    assert settings.chat_template_kwargs_for({"reasoning_effort": "high"}, "low") == {
        "enable_thinking": True, "reasoning_effort": "high"}
    assert ServerSettings().chat_template_kwargs_for(None, None) is None
