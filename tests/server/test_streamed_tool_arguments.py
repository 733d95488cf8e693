"""Streamed "auto" tool-call arguments (issue 61, item 7), vLLM's deltas: a call's first entry carries its index, id,
type and name (arguments ""), later entries its index and the next fragment of its arguments as the model writes
them. Fed a model's text a character or a few at a time (so cut inside keys, escapes, numbers and between calls),
every JSON-argument format's fragments add up to exactly the non-streamed response's arguments."""

import json
import random

import pytest

from jaxpaged.server.openai.call_deltas import RequiredCallStream
from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.responses_endpoint import _ResponseView, _StreamedItems
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.tool import make_tool_parser
from jaxpaged.server.parsers.tool.call_reader import CallReader
from jaxpaged.server.parsers.tool.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from jaxpaged.server.parsers.tool.functiongemma import END as GEMMA_END
from jaxpaged.server.parsers.tool.functiongemma import START as GEMMA_START
from tests.server.call_fragments import delta_entries, merged_calls

# The arguments as a model may write them: irregular spaces, escapes json.dumps writes otherwise (\u00e9, a surrogate
# pair, \/), numbers json.dumps writes otherwise (2.50, -0, 1E3), literals, empty containers.
RAW_ARGUMENTS = ('{ "city" :"Pa\\"ris\\\\ \\u00e9 \\ud83d\\ude00\\n\\/","days":[1,2.50 ,-0,1E3],'
                 '"flags":{"on":true,"off":null},"empty":{},"list":[ ]}')
EXPECTED_ARGUMENTS = json.dumps(json.loads(RAW_ARGUMENTS), ensure_ascii=False)
"""What the finished response carries (json.dumps's layout), the independent reference for the fragments."""
TIME_ARGUMENTS = '{"tz": "CET"}'
NAMES = ["get_weather", "get_time"]

# (parser, the model's text, the content before the calls): two calls each, the first with RAW_ARGUMENTS.
FORMATS = {
    "hermes": (f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {RAW_ARGUMENTS}}}\n</tool_call>\n'
               f'<tool_call>\n{{"name": "get_time", "arguments": {TIME_ARGUMENTS}}}\n</tool_call>', "Let me check."),
    "llama3_json": (f'{{"name": "get_weather", "parameters": {RAW_ARGUMENTS}}}; '
                    f'{{"name": "get_time", "parameters": {TIME_ARGUMENTS}}}', None),
    "mistral": (f'Checking.[TOOL_CALLS][{{"name": "get_weather", "arguments": {RAW_ARGUMENTS}}}, '
                f'{{"name": "get_time", "arguments": {TIME_ARGUMENTS}}}]', "Checking."),
    "mistral v11": (f"[TOOL_CALLS]get_weather[ARGS]{RAW_ARGUMENTS}[TOOL_CALLS]get_time[ARGS]{TIME_ARGUMENTS}", None),
    "xlam": (f'Sure.\n```json\n[{{"name": "get_weather", "arguments": {RAW_ARGUMENTS}}}, '
             f'{{"name": "get_time", "arguments": {TIME_ARGUMENTS}}}]\n```', "Sure."),
    "deepseek_v3": (f"Let me look.{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{RAW_ARGUMENTS}\n```"
                    f"{CALL_END}{CALL_BEGIN}function{SEP}get_time\n```json\n{TIME_ARGUMENTS}\n```{CALL_END}{CALLS_END}",
                    "Let me look."),
    "deepseek_v31": (f"{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{RAW_ARGUMENTS}{CALL_END}"
                     f"{CALL_BEGIN}get_time{SEP}{TIME_ARGUMENTS}{CALL_END}{CALLS_END}", None),
}


def _choice(parser_name: str, max_calls=None) -> ChoiceText:
    return ChoiceText(ToolCalling([], None, make_tool_parser(parser_name.split(" ")[0]), max_calls), None, False)


def _stream(choice: ChoiceText, text: str, ends: list[int]) -> list[dict]:
    return [choice.delta(text[:end], end == len(text)) for end in ends]


def _whole(parser_name: str, text: str) -> dict:
    return _choice(parser_name).message(text)


@pytest.mark.parametrize("name", list(FORMATS))
def test_fragments_add_up_to_the_non_streamed_arguments(name):
    """One character at a time: the same calls (names, count, arguments text exactly) and content as the
    non-streamed response; the first call's arguments are json.dumps's layout of what the model wrote."""
    text, content = FORMATS[name]
    deltas = _stream(_choice(name), text, list(range(1, len(text) + 1)))
    streamed = merged_calls(delta_entries(deltas))
    message = _whole(name, text)
    assert [(c["name"], c["arguments"]) for c in streamed] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert [c["name"] for c in streamed] == NAMES and streamed[0]["arguments"] == EXPECTED_ARGUMENTS
    assert json.loads(streamed[1]["arguments"]) == json.loads(TIME_ARGUMENTS)
    assert "".join(d.get("content", "") for d in deltas).rstrip() == (content or "") == (message["content"] or "")


@pytest.mark.parametrize("name", list(FORMATS))
def test_arguments_go_out_as_they_are_written(name):
    """The first call's name goes out before its arguments are written, and its arguments in many fragments, each
    before the text that completes the call: the stream does not wait for the call's end."""
    text, _ = FORMATS[name]
    deltas = _stream(_choice(name), text, list(range(1, len(text) + 1)))
    call_end = text.index("get_time")  # the second call starts after the first one ended
    first = [(step, entry) for step, delta in enumerate(deltas) for entry in delta.get("tool_calls", [])
             if entry["index"] == 0]
    assert "id" in first[0][1] and first[0][0] < text.index(RAW_ARGUMENTS)
    fragments = [step for step, entry in first[1:] if step < call_end]
    assert len(fragments) >= 20 and "".join(e["function"]["arguments"] for _, e in first) == EXPECTED_ARGUMENTS


@pytest.mark.parametrize("name", list(FORMATS))
def test_any_cut_of_the_text_gives_the_same_calls(name):
    """Random chunkings (1 to 7 characters, as tokens cut text): every one adds up to the non-streamed calls."""
    text, _ = FORMATS[name]
    expected = [(c["function"]["name"], c["function"]["arguments"]) for c in _whole(name, text)["tool_calls"]]
    rng = random.Random(name)
    for _ in range(20):
        ends, end = [], 0
        while end < len(text):
            end = min(len(text), end + rng.randint(1, 7))
            ends.append(end)
        streamed = merged_calls(delta_entries(_stream(_choice(name), text, ends)))
        assert [(c["name"], c["arguments"]) for c in streamed] == expected


@pytest.mark.parametrize("document", [
    '{"a": "x\\u00e9\\ud83d\\ude00y", "b": [1, 2.50, -0, 1E3, true, null]}',
    '"just a string with \\"quotes\\" and \\\\ backslashes"',
    '{"lone": "\\ud800x", "pair split": "\\ud83d\\u0041", "slash": "\\/"}',
    '[1e400, -1e400, 12345678901234567890, 0.1]',
    '{"nested": {"deeper": [[[{}]]], "z": ""}}',
    "42",
])
def test_a_value_is_rewritten_as_json_dumps_writes_it(document):
    """A call's arguments read a character at a time (value layout: DeepSeek's, Mistral v11's): the fragments
    are json.dumps(json.loads(text)), a string argument as its text; escapes cut in half wait for their end."""
    reader = CallReader(0, name="f")
    for end in range(1, len(document) + 1):
        reader.read(document, end, finished=end == len(document))
    value = json.loads(document)
    expected = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    assert "".join(reader.drafts[0].fragments) == expected and reader.drafts[0].complete


def test_a_string_of_arguments_streams_as_its_text():
    """hermes with "arguments" written as a JSON string (some models do): the fragments are the string's text,
    which is what the non-streamed call carries."""
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>'
    streamed = merged_calls(delta_entries(_stream(_choice("hermes"), text, list(range(1, len(text) + 1)))))
    assert [(c["name"], c["arguments"]) for c in streamed] == [("f", '{"a": [1, 2]}')]
    assert _whole("hermes", text)["tool_calls"][0]["function"]["arguments"] == '{"a": [1, 2]}'


def test_a_name_written_after_the_arguments_waits_then_sends_them():
    """{"arguments": ..., "name": ...}: the call's first entry waits for the name, then the arguments follow."""
    text = '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>'
    deltas = _stream(_choice("hermes"), text, list(range(1, len(text) + 1)))
    assert not any("tool_calls" in d for d in deltas[:text.index('"name"')])
    assert [(c["name"], c["arguments"]) for c in merged_calls(delta_entries(deltas))] == \
        [("get_weather", '{"city": "Paris"}')]


def test_a_call_without_arguments_streams_an_empty_object():
    """A call object without an arguments key has {} for arguments, streamed and not (llama3_json)."""
    text = '{"name": "get_time"}; {"name": "get_weather", "parameters": {"city": "Paris"}}'
    streamed = merged_calls(delta_entries(_stream(_choice("llama3_json"), text, list(range(1, len(text) + 1)))))
    assert [(c["name"], c["arguments"]) for c in streamed] == \
        [("get_time", "{}"), ("get_weather", '{"city": "Paris"}')]


def test_parallel_tool_calls_false_streams_only_the_first_call():
    """max_calls 1 (parallel_tool_calls false): the second call never begins in the stream either."""
    text, _ = FORMATS["llama3_json"]
    choice = _choice("llama3_json", max_calls=1)
    streamed = merged_calls(delta_entries(_stream(choice, text, list(range(1, len(text) + 1)))))
    assert [(c["name"], c["arguments"]) for c in streamed] == [("get_weather", EXPECTED_ARGUMENTS)]
    assert choice.num_calls_sent == 1


class _EventCounter:
    """What _StreamedItems needs of its response view: numbered events."""

    sequence_number = 0
    _event = _ResponseView._event


def test_the_responses_stream_opens_one_function_call_item_per_call():
    """The Responses API stream takes the chat entries: an item per call, its arguments as delta events, and
    function_call_arguments.done with the whole arguments."""
    text, _ = FORMATS["hermes"]
    items = _StreamedItems(_EventCounter())  # type: ignore[arg-type]
    events = [event for d in _stream(_choice("hermes"), text, list(range(1, len(text) + 1)))
              for event in items.add(None, d.get("content"), d.get("tool_calls"))] + items.close_open()
    payloads = [json.loads(event.split("data: ", 1)[1]) for event in events]
    done = [p for p in payloads if p["type"] == "response.function_call_arguments.done"]
    assert [(p["name"], p["arguments"]) for p in done] == [("get_weather", EXPECTED_ARGUMENTS),
                                                           ("get_time", TIME_ARGUMENTS)]
    deltas = [p for p in payloads if p["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 20 and "".join(p["delta"] for p in deltas) == EXPECTED_ARGUMENTS + TIME_ARGUMENTS


# ----------------------------------------------------------------------------------------------------- functiongemma

GEMMA_TEXT = (f"I'll check.{GEMMA_START}call:get_weather{{city:<escape>Paris, {{France}} \"quoted\"<escape>,"
              f"days:3,units:{{temp:<escape>C<escape>}},tags:[<escape>a<escape>,true],code:<escape>42<escape>}}"
              f"{GEMMA_END}{GEMMA_START}call:get_time{{}}{GEMMA_END}")
GEMMA_CALLS = [("get_weather", {"city": 'Paris, {France} "quoted"', "days": 3, "units": {"temp": "C"},
                                "tags": ["a", True], "code": 42}),
               ("get_time", {})]


def test_functiongemma_reads_its_notation():
    """Strings between <escape> tokens keep commas, braces and quotes; bare numbers and true are typed; an
    <escape>-wrapped number is typed as vLLM types it; nested objects and lists are read; text before is content."""
    message = _whole("functiongemma", GEMMA_TEXT)
    assert message["content"] == "I'll check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
        GEMMA_CALLS


@pytest.mark.parametrize("text", [
    f"{GEMMA_START}call:f{{a:<escape>unclosed}}{GEMMA_END}",
    f"{GEMMA_START}call:f{{a:1,,b:2}}{GEMMA_END}",
    f"{GEMMA_START}call:{{a:1}}{GEMMA_END}",
    f"{GEMMA_START}get_weather{{a:1}}{GEMMA_END}",
])
def test_functiongemma_malformed_calls_are_content(text):
    """A call that is not FunctionGemma's notation is left out; with no call left, all the text is content."""
    assert _whole("functiongemma", text) == {"role": "assistant", "content": text}


def test_functiongemma_streams_each_argument_once_its_value_is_whole():
    """Streamed a character at a time (cut inside keys, <escape> tokens and between the calls): the same calls,
    arguments text and content as the whole text; the name goes out first, then each argument as its value ends
    (one fragment per argument, the closing brace with the last), before the call's end token."""
    text = GEMMA_TEXT
    deltas = _stream(_choice("functiongemma"), text, list(range(1, len(text) + 1)))
    streamed = merged_calls(delta_entries(deltas))
    whole = _whole("functiongemma", text)["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in streamed] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in whole]
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == GEMMA_CALLS
    assert "".join(d.get("content", "") for d in deltas) == "I'll check."
    first_end = text.index(GEMMA_END)
    fragments = [e["function"]["arguments"] for e in delta_entries(deltas[:first_end]) if "id" not in e]
    assert len(fragments) == len(GEMMA_CALLS[0][1]) and fragments[-1] == ', "code": 42}'
    assert fragments[0] == '{"city": "Paris, {France} \\"quoted\\""'


def test_functiongemma_any_cut_gives_the_same_calls():
    """Random chunkings of the FunctionGemma text add up to the non-streamed calls; a malformed argument stops
    the draft (the finished text has no call, so all of it is content)."""
    expected = [(c["function"]["name"], c["function"]["arguments"])
                for c in _whole("functiongemma", GEMMA_TEXT)["tool_calls"]]
    rng = random.Random(7)
    for _ in range(30):
        ends, end = [], 0
        while end < len(GEMMA_TEXT):
            end = min(len(GEMMA_TEXT), end + rng.randint(1, 9))
            ends.append(end)
        streamed = merged_calls(delta_entries(_stream(_choice("functiongemma"), GEMMA_TEXT, ends)))
        assert [(c["name"], c["arguments"]) for c in streamed] == expected
    bad = f"{GEMMA_START}call:f{{a:1,,b:2}}{GEMMA_END}"
    deltas = _stream(_choice("functiongemma"), bad, list(range(1, len(bad) + 1)))
    assert "".join(d.get("content", "") for d in deltas) == bad
    assert [e["function"]["arguments"] for e in delta_entries(deltas) if "id" not in e] == ['{"a": 1']


def test_required_calls_stream_their_parameters_as_sampled():
    """tool_choice "required" (the grammar's array of {"name", "parameters"}): names first, then the parameters in
    fragments, adding up to the non-streamed calls; finish counts the finished array's calls."""
    calling = ToolCalling([], None)
    text = (f'[{{"name": "get_weather", "parameters": {json.dumps(json.loads(RAW_ARGUMENTS))}}}, '
            f'{{"name": "get_time", "parameters": {TIME_ARGUMENTS}}}]')
    stream = RequiredCallStream(calling)
    deltas = [stream.delta(text[:end], end == len(text)) for end in range(1, len(text) + 1)]
    entries = delta_entries(deltas)
    assert [(c["name"], c["arguments"]) for c in merged_calls(entries)] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in calling.calls(text)] == \
        [("get_weather", EXPECTED_ARGUMENTS), ("get_time", TIME_ARGUMENTS)]
    assert len(entries) > 20 and stream.num_calls_sent == 2
