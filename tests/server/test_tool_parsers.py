"""The hermes tool-call parser (tool_choice "auto"): content and calls split out of hand-written model outputs,
whole and as a stream, and malformed calls kept as text."""

import json

import pytest

from jaxpaged.server.chat import _ChatView
from jaxpaged.server.context import ServerSettings
from jaxpaged.server.tool_calls import ToolCalling
from jaxpaged.server.tool_parsers import HermesToolParser, make_tool_parser

PARSER = HermesToolParser()
TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>')


def test_calls_and_content_are_split():
    assert PARSER.calls(TWO_CALLS) == [("get_weather", '{"city": "Paris"}'), ("get_time", '{"timezone": "CET"}')]
    assert PARSER.content(TWO_CALLS) == "Let me check."
    only_call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert PARSER.calls(only_call) == [("f", "{}")] and PARSER.content(only_call) is None


@pytest.mark.parametrize("text", ["Plain answer.", "<tool_call>not json</tool_call>", '<tool_call>{"x": 1}',
                                  "Use <tool_call> tags."])
def test_no_well_formed_call_means_text(text):
    assert PARSER.calls(text) == []


def test_a_call_cut_off_before_its_end_tag_still_parses_when_its_json_is_whole():
    assert PARSER.calls('<tool_call>{"name": "f", "arguments": {"a": 1}}') == [("f", '{"a": 1}')]


@pytest.mark.parametrize("text, safe", [("Hello", 5), ("Hello <", 6), ("Hello <tool_c", 6), ("Hi <tool_call>{", 3),
                                        ("a<b", 3)])
def test_streamed_content_holds_back_a_possible_call_start(text, safe):
    assert PARSER.stream_content(text) == safe


def test_streaming_deltas_add_up_to_the_whole_response():
    calling = ToolCalling([], None, PARSER)
    sent = [0]
    deltas = [_ChatView._auto_delta(TWO_CALLS[:end], end == len(TWO_CALLS), calling, sent, 0)
              for end in range(1, len(TWO_CALLS) + 1)]
    content = "".join(d.get("content", "") for d in deltas)
    assert content == "Let me check.\n"
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert len(calls) == 1 and [c["function"]["name"] for c in calls[0]] == ["get_weather", "get_time"]
    assert json.loads(calls[0][1]["function"]["arguments"]) == {"timezone": "CET"}
    plain = [0]
    text = "No tools needed <3"
    streamed = [_ChatView._auto_delta(text[:end], end == len(text), calling, plain, 0) for end in range(1, 19)]
    assert "".join(d.get("content", "") for d in streamed) == text


def test_unknown_parser_is_refused_by_name():
    assert make_tool_parser(None) is None
    with pytest.raises(ValueError, match="^tool_call_parser: "):
        ServerSettings(tool_call_parser="mystery")
