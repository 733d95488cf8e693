"""Deep, unterminated nesting in a model's tool call (issue 56, finding 7) is a malformed call, never a
RecursionError: the whole text comes back as content, whole or streamed, and a stream still ends with [DONE]."""

import asyncio
import json

import pytest

from jaxpaged.outputs import CompletionOutput, RequestMetrics, RequestOutput
from jaxpaged.server.openai.chat import _ChatView
from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.harmony_text import choice_text
from jaxpaged.server.openai.protocol import ChatCompletionRequest
from jaxpaged.server.openai.streaming import SSE_DONE
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.tool import TOOL_CALL_PARSERS, make_tool_parser
from jaxpaged.server.parsers.tool.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, SEP
from jaxpaged.server.parsers.tool.json_depth import MAX_JSON_DEPTH, load_json, nested_too_deep
from tests.server.call_fragments import delta_entries, merged_calls

DEPTH = 100_000
NESTINGS = {"objects": '{"a":' * DEPTH, "arrays": "[" * DEPTH}

# Each format's call with the nesting as its arguments: (text before, text after) the nesting.
FORMATS = {
    "hermes": ("Checking.<tool_call>", ""),
    "hermes (closed)": ("<tool_call>", "</tool_call>"),
    "llama3_json": ('{"name": "f", "parameters": ', ""),
    "pythonic": ("[f(a=", ""),
    "mistral": ('[TOOL_CALLS][{"name": "f", "arguments": ', ""),
    "mistral (v11)": ("[TOOL_CALLS]f[ARGS]", ""),
    "deepseek_v3": (f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}", ""),
    "deepseek_v3 (closed)": (f"{CALLS_BEGIN}{CALL_BEGIN}f{SEP}", CALL_END),
    "xlam": ('[{"name": "f", "arguments": ', ""),
    "functiongemma": ("<start_function_call>call:f{a:", "}<end_function_call>"),
}
# Formats whose arguments are text the parser passes on undecoded (a qwen3_xml parameter value that is no JSON
# stays a string; harmony's body is the arguments): a deep nesting is a call whose arguments hold it as text.
TEXT_ARGUMENTS = {
    "qwen3_xml": ("<tool_call>\n<function=f>\n<parameter=a>\n", "\n</parameter>\n</function>\n</tool_call>"),
    "openai": ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>", "<|call|>"),
}
CASES = [(name, nesting) for name in FORMATS for nesting in NESTINGS]
STREAM_CHUNK_CHARS = 997


def _attack(name: str, nesting: str) -> tuple[str, str]:
    """(parser name, the model's text) of one case."""
    before, after = FORMATS[name]
    return name.split(" ")[0], before + NESTINGS[nesting] + after


def test_every_parser_is_covered():
    """Each --tool-call-parser format (deepseek_v31 shares deepseek_v3's) has a deep-nesting case."""
    covered = {name.split(" ")[0] for name in FORMATS} | set(TEXT_ARGUMENTS)
    assert covered | {"deepseek_v31", "qwen3_coder"} == set(TOOL_CALL_PARSERS)


@pytest.mark.parametrize("name", list(TEXT_ARGUMENTS))
@pytest.mark.parametrize("nesting", list(NESTINGS))
def test_deep_nesting_passes_through_formats_with_text_arguments(name, nesting):
    """qwen3_xml and harmony: the nesting comes back as the call's argument text, whole and streamed, without a
    RecursionError and without decoding it."""
    before, after = TEXT_ARGUMENTS[name]
    text = before + NESTINGS[nesting] + after
    parser = make_tool_parser(name)
    assert parser is not None
    calls = parser.calls(text)
    assert len(calls) == 1 and _argument_text(name, calls[0][1]) == NESTINGS[nesting]
    choice = choice_text(ToolCalling([], None, parser), None, False, True)
    ends = [*range(STREAM_CHUNK_CHARS, len(text), STREAM_CHUNK_CHARS), len(text)]
    streamed = merged_calls([call for end in ends
                             for call in choice.delta(text[:end], end == len(text)).get("tool_calls", [])],
                            whole_first=name == "openai")  # harmony's calls go whole
    assert len(streamed) == 1 and _argument_text(name, streamed[0]["arguments"]) == NESTINGS[nesting]


def _argument_text(name: str, arguments: str) -> str:
    """The nesting as the call carries it: qwen3_xml's parameter `a` (a JSON string, one level deep), harmony's
    whole body."""
    return json.loads(arguments)["a"] if name == "qwen3_xml" else arguments


@pytest.mark.parametrize("name, nesting", CASES)
def test_deep_nesting_is_content_when_whole(name, nesting):
    """A finished output whose call nests 100,000 levels deep has no calls: all of it is content."""
    parser_name, text = _attack(name, nesting)
    parser = make_tool_parser(parser_name)
    assert parser is not None
    message = ChoiceText(ToolCalling([], None, parser), None, False).message(text)
    assert message == {"role": "assistant", "content": text}


@pytest.mark.parametrize("name, nesting", CASES)
def test_deep_nesting_streams_as_content(name, nesting):
    """Streamed in chunks, the same output goes out as content (held back while a call may be open) and the deltas
    add up to the text. A call whose name came first has begun (its arguments stream as written, as vLLM's do),
    but its drafts stop at MAX_JSON_DEPTH levels: no more than that much of the nesting goes out as arguments."""
    parser_name, text = _attack(name, nesting)
    choice = ChoiceText(ToolCalling([], None, make_tool_parser(parser_name)), None, False)
    ends = [*range(STREAM_CHUNK_CHARS, len(text), STREAM_CHUNK_CHARS), len(text)]
    deltas = [choice.delta(text[:end], end == len(text)) for end in ends]
    begun = merged_calls(delta_entries(deltas))
    assert [call["name"] for call in begun] in ([], ["f"])
    assert all(len(call["arguments"]) <= len('{"a": ') * (MAX_JSON_DEPTH + 1) for call in begun)
    assert "".join(delta.get("content", "") for delta in deltas) == text
    assert choice.num_calls_sent == 0  # the finished text holds no call


def test_the_depth_check_counts_brackets_outside_strings():
    """Brackets inside strings (escaped quotes included) do not count; nesting at the limit decodes, one level
    more is refused; an unterminated string does not hide the brackets before it."""
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert load_json(at_limit) == json.loads(at_limit)
    with pytest.raises(ValueError, match="nested deeper"):
        load_json("[" + at_limit + "]")
    in_strings = json.dumps(["[{" * 1000, '\\"[' * 500])
    assert not nested_too_deep(in_strings) and load_json(in_strings) == ["[{" * 1000, '\\"[' * 500]
    assert nested_too_deep("[" * (MAX_JSON_DEPTH + 1) + '"unterminated [[[')
    assert not nested_too_deep('"' + "[" * 1000)  # all inside one unterminated string


class _OneOutputRun:
    """A stand-in GenerationRun that produces one finished output with `text`."""

    def __init__(self, text: str) -> None:
        sample = CompletionOutput(index=0, text=text, token_ids=[0] * 8, cumulative_logprob=None, logprobs=None,
                                  finish_reason="stop")
        self.final = RequestOutput(request_id="chatcmpl-test", prompt=None, prompt_token_ids=[1, 2],
                                   num_cached_tokens=0, outputs=[sample], finished=True,
                                   metrics=RequestMetrics(arrival_time=0.0))
        self.finals = [self.final]

    async def outputs(self):
        yield 0, self.final


async def _events(view: _ChatView, run: _OneOutputRun) -> list[str]:
    return [event async for event in view.events(run)]  # type: ignore[arg-type]


@pytest.mark.parametrize("name, nesting", [("hermes", "arrays"), ("deepseek_v3 (closed)", "objects"),
                                           ("mistral", "arrays"), ("llama3_json", "objects")])
def test_a_chat_stream_of_deep_nesting_ends_with_done(name, nesting):
    """The chat stream of such an output sends it as content, finishes with "stop" and ends with [DONE]."""
    parser_name, text = _attack(name, nesting)
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                    "stream": True})
    calling = ToolCalling([], None, make_tool_parser(parser_name))
    view = _ChatView(request, None, "m", "chatcmpl-test", calling, [ChoiceText(calling, None, False)], [1, 2], False)
    events = asyncio.run(_events(view, _OneOutputRun(text)))
    assert events[-1] == SSE_DONE
    chunks = [json.loads(event[len("data: "):]) for event in events[:-1]]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert "".join(delta.get("content") or "" for delta in deltas) == text
    assert not any("tool_calls" in delta for delta in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
