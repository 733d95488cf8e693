"""The tool-call parsers (tool_choice "auto"): content and calls split out of model-format text (a fixture per
parser), whole and as a stream, malformed calls kept as text, and no quadratic scan of free text."""

import json
import time

import pytest

from jaxpaged.server.context import ServerSettings
from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.tool import TOOL_CALL_PARSERS, HermesToolParser, make_tool_parser
from tests.server.call_fragments import delta_entries, merged_calls

WEATHER_PARIS = ("get_weather", {"city": "Paris"})
TIME_CET = ("get_time", {"timezone": "CET"})

# (parser, the model's text, the content, the calls): each in the format its models write.
FIXTURES = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "CET"}}\n</tool_call>',
               "Let me check.", [WEATHER_PARIS, TIME_CET]),
    "llama3_json": ('{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {"timezone": "CET"}}', None, [WEATHER_PARIS, TIME_CET]),
    "pythonic": ('[get_weather(city="Paris"), get_time(timezone="CET")]', None, [WEATHER_PARIS, TIME_CET]),
    "mistral": ('Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {"timezone": "CET"}}]', "Checking.", [WEATHER_PARIS, TIME_CET]),
    "deepseek_v3": ("Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                    '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>'
                    'get_time\n```json\n{"timezone": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
                    "Let me look.", [WEATHER_PARIS, TIME_CET]),
    "qwen3_xml": ("I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                  "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=timezone>\nCET\n"
                  "</parameter>\n</function>\n</tool_call>", "I'll check.", [WEATHER_PARIS, TIME_CET]),
    "xlam": ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
             '{"name": "get_time", "arguments": {"timezone": "CET"}}]', None, [WEATHER_PARIS, TIME_CET]),
}
OTHER_LAYOUTS = {
    "llama3_json": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [WEATHER_PARIS]),
    "mistral": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"timezone": "CET"}', None,
                [WEATHER_PARIS, TIME_CET]),
    "deepseek_v31": ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
                     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", None, [WEATHER_PARIS]),
    "qwen3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n<parameter=units>\n{\"t\": \"C\"}\n</parameter>\n</function>\n"
                    "</tool_call>", None, [("get_weather", {"city": "Paris", "days": 3, "units": {"t": "C"}})]),
    "xlam": ('Sure.\n```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```', "Sure.",
             [WEATHER_PARIS]),
}
PLAIN = {"hermes": "Use <tool_call> tags.", "llama3_json": "The weather is {sunny}.", "pythonic": "Sure: [1, 2].",
         "mistral": "No calls [here].", "deepseek_v3": "Plain answer.",
         "qwen3_xml": "Write <function=f> in a <tool_call> block.", "xlam": "Lists look like [1, 2]."}


def _decoded(calls):
    return [(name, json.loads(arguments)) for name, arguments in calls]


@pytest.mark.parametrize("name, fixture", [*FIXTURES.items(), *OTHER_LAYOUTS.items()])
def test_calls_and_content_are_split(name, fixture):
    text, content, calls = fixture
    parser = make_tool_parser(name)
    assert parser is not None
    assert _decoded(parser.calls(text)) == calls
    assert parser.content(text) == content


@pytest.mark.parametrize("name", list(PLAIN))
def test_text_without_a_well_formed_call_is_content(name):
    parser = make_tool_parser(name)
    assert parser is not None
    assert parser.calls(PLAIN[name]) == [] and parser.content(PLAIN[name]) == PLAIN[name]


@pytest.mark.parametrize("text", ["Plain answer.", "<tool_call>not json</tool_call>", '<tool_call>{"x": 1}',
                                  "Use <tool_call> tags."])
def test_hermes_without_a_well_formed_call_means_text(text):
    assert HermesToolParser().calls(text) == []


def test_a_call_cut_off_before_its_end_tag_still_parses_when_its_json_is_whole():
    assert HermesToolParser().calls('<tool_call>{"name": "f", "arguments": {"a": 1}}') == [("f", '{"a": 1}')]


@pytest.mark.parametrize("text, safe", [("Hello", 5), ("Hello <", 6), ("Hello <tool_c", 6), ("Hi <tool_call>{", 3),
                                        ("a<b", 3)])
def test_streamed_content_holds_back_a_possible_call_start(text, safe):
    assert HermesToolParser().stream_content(text) == safe


def _stream(name: str, text: str) -> list[dict]:
    """The deltas of `text` streamed one character at a time through an "auto" choice."""
    parser = make_tool_parser(name)
    choice = ChoiceText(ToolCalling([], None, parser), None, False)
    return [choice.delta(text[:end], end == len(text)) for end in range(1, len(text) + 1)]


@pytest.mark.parametrize("name, fixture", [*FIXTURES.items(), *OTHER_LAYOUTS.items()])
def test_streaming_deltas_add_up_to_the_whole_response(name, fixture):
    text, content, calls = fixture
    deltas = _stream(name, text)
    assert "".join(d.get("content", "") for d in deltas).rstrip() == (content or "")
    streamed = merged_calls(delta_entries(deltas))
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == calls


@pytest.mark.parametrize("name", list(PLAIN))
def test_plain_text_streams_whole(name):
    deltas = _stream(name, PLAIN[name])
    assert "".join(d.get("content", "") for d in deltas) == PLAIN[name]
    assert not any("tool_calls" in d for d in deltas)


def test_mistral_call_ids_are_nine_alphanumerics():
    parser = make_tool_parser("mistral")
    call = ToolCalling([], None, parser).call("f", "{}")
    assert len(call["id"]) == 9 and call["id"].isalnum()
    assert parser is not None and parser.keeps_special_tokens


def test_hermes_is_linear_on_an_unclosed_block_of_whitespace():
    """Issue 43: `<tool_call>x` + whitespace + a non-space took quadratic time in the old regex."""
    text = "<tool_call>x" + " " * 200_000 + "y"
    start = time.perf_counter()
    assert HermesToolParser().calls(text) == []
    assert time.perf_counter() - start < 0.5


def test_unknown_parsers_are_refused_naming_the_flag():
    assert make_tool_parser(None) is None
    assert set(TOOL_CALL_PARSERS) >= {"hermes", "llama3_json", "pythonic", "mistral", "deepseek_v3"}
    with pytest.raises(ValueError, match="^tool_call_parser: unknown parser 'mystery'; --tool-call-parser takes"):
        ServerSettings(tool_call_parser="mystery")
    with pytest.raises(ValueError, match="^tool_call_parser: vLLM's parser 'granite' is not implemented"):
        ServerSettings(tool_call_parser="granite")


@pytest.mark.parametrize("name", ["hermes", "deepseek_v3", "qwen3_xml"])
def test_block_formats_stream_each_call_as_soon_as_it_is_complete(name):
    """hermes, qwen3_xml and DeepSeek close every call with its own end marker: the stream need not wait for the end."""
    text = FIXTURES[name][0]
    deltas = _stream(name, text)
    first_call = text.index(FIXTURES[name][2][1][0]) - 1  # where the second call's name starts
    sent_before = merged_calls(delta_entries(deltas[:first_call]))
    assert sent_before[0]["name"] == FIXTURES[name][2][0][0]
    assert json.loads(sent_before[0]["arguments"]) == FIXTURES[name][2][0][1]  # the first call went out whole


def test_qwen3_xml_constrains_nothing_it_cannot_write():
    """qwen3_xml shares hermes's block search but not its JSON-block grammar: "auto" output stays unconstrained."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    qwen3_xml, hermes = make_tool_parser("qwen3_xml"), make_tool_parser("hermes")
    assert qwen3_xml is not None and hermes is not None
    assert qwen3_xml.auto_grammar(tools) is None and hermes.auto_grammar(tools) is not None
