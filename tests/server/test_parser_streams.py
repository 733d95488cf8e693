"""Streamed tool calls and reasoning keep their place in the text (issue 56, finding 7): a stream's parsers look at
each character a bounded number of times, not at the whole output every step, and what they send at each step is
what the whole-text rules say of the text so far."""

import json
import random

import pytest

from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.reasoning import END as THINK_END
from jaxpaged.server.parsers.reasoning import START as THINK_START
from jaxpaged.server.parsers.reasoning import ReasoningStream, make_reasoning_parser
from jaxpaged.server.parsers.tool import TOOL_CALL_PARSERS, ToolParser, make_tool_parser
from jaxpaged.server.parsers.tool.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, SEP
from tests.server.call_fragments import delta_entries, merged_calls

LONG_OUTPUT_CHARS = 128_000
CHUNK_CHARS = 4  # about a token's text
MAX_WORK_PER_CHAR = 5  # marker searches, the call parse, and the drafts that stream arguments as they grow

CALL_END_MARKERS = {"hermes": "</tool_call>", "deepseek_v3": CALL_END, "deepseek_v31": CALL_END,
                    "qwen3_xml": "</tool_call>", "qwen3_coder": "</tool_call>", "functiongemma": "<end_function_call>"}
"""The formats that send each call when its end marker arrives."""


def _hermes_call(index: int) -> str:
    arguments = {"city": f"Paris {index}", "days": [1, 2, 3], "units": {"temperature": "C"}}
    return f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': arguments})}\n</tool_call>\n"


def _deepseek_call(index: int) -> str:
    return (f"{CALL_BEGIN}function{SEP}get_weather\n```json\n"
            f'{json.dumps({"city": f"Paris {index}", "days": [1, 2]})}\n```{CALL_END}')


def _long_output(name: str) -> tuple[str, int]:
    """About LONG_OUTPUT_CHARS of calls in `name`'s format after some prose, and how many calls it holds."""
    text, num_calls = ("Let me look that up. " * 4 + (CALLS_BEGIN if name == "deepseek_v3" else "")), 0
    while len(text) < LONG_OUTPUT_CHARS:
        text += (_hermes_call if name == "hermes" else _deepseek_call)(num_calls)
        num_calls += 1
    return text, num_calls


def _stream(choice: ChoiceText, text: str, chunk_chars: int) -> list[dict]:
    """The deltas of `text` handed over `chunk_chars` characters at a time (the last step finishes it)."""
    ends = [*range(chunk_chars, len(text), chunk_chars), len(text)]
    return [choice.delta(text[:end], end == len(text)) for end in ends]


@pytest.mark.parametrize("name", ["hermes", "deepseek_v3"])
def test_a_long_streamed_output_costs_linear_work(name):
    """128k characters of calls, 4 at a time: the scanner looks at each character a few times (at most 5 in all);
    re-reading the whole text each step, as issue 56 measured, would be about 16,000 times the text."""
    text, num_calls = _long_output(name)
    choice = ChoiceText(ToolCalling([], None, make_tool_parser(name)), None, False)
    deltas = _stream(choice, text, CHUNK_CHARS)
    assert choice.scanner is not None and choice.scanner.num_scanned <= MAX_WORK_PER_CHAR * len(text)
    streamed = merged_calls(delta_entries(deltas))
    assert len(streamed) == num_calls
    assert json.loads(streamed[-1]["arguments"])["city"] == f"Paris {num_calls - 1}"
    assert sum(1 for delta in deltas[:-1] if "tool_calls" in delta) >= num_calls - 1  # each as it was written


def test_a_long_streamed_reasoning_costs_linear_work():
    """128k characters of reasoning then content, 4 at a time: the reasoning stream's work is linear too."""
    reasoning = "Let me think about this <b>carefully</b>. " * (LONG_OUTPUT_CHARS // 42)
    text = f"{THINK_START}{reasoning}{THINK_END}The answer."
    choice = ChoiceText(None, make_reasoning_parser("qwen3"), False)
    deltas = _stream(choice, text, CHUNK_CHARS)
    assert choice.reasoning_stream is not None
    assert choice.reasoning_stream.num_scanned <= MAX_WORK_PER_CHAR * len(text)
    assert "".join(delta.get("reasoning", "") for delta in deltas) == reasoning
    assert "".join(delta.get("content", "") for delta in deltas) == "The answer."


# ----------------------------------------------------------------------------- agreement with the whole-text rules

def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """Trailing characters of `text` that might begin a marker (the longest such tail)."""
    return max((keep for marker in markers for keep in range(1, min(len(marker) - 1, len(text)) + 1)
                if marker.startswith(text[-keep:])), default=0)


def _whole_text_rule(parser: ToolParser, name: str, text: str, finished: bool) -> tuple[int, list]:
    """What a stream may send of `text` so far, read from the start (the rules the stream followed before it kept
    its place): content up to the call section or a possible marker start; the calls of the prefix that ends
    after the last call end marker (formats with one); when finished, the final calls."""
    start = parser.section_start(text)
    if finished:
        calls = parser.calls(text)
        return (start if calls else len(text)), calls
    if parser.opener is not None and not text.strip():
        end = 0
    else:
        end = start if start >= 0 else len(text) - _held_back(text, parser.markers)
    marker = CALL_END_MARKERS.get(name)
    cut = text.rfind(marker) if marker else -1
    return end, (parser.calls(text[:cut + len(marker)]) if marker and cut >= 0 else [])


PIECES = {
    "hermes": ["Sure. ", "<tool_call>", "</tool_call>", "<tool_", "\n", '{"name": "f", "arguments": {"a": [1]}}',
               '{"name": "g"}', "not json", "<", "}"],
    "deepseek_v3": ["Look.", CALLS_BEGIN, CALL_BEGIN, CALL_END, SEP, "function", "f\n```json\n", '{"a": 1}',
                    "\n```", "g", "<｜tool▁", " "],
    "llama3_json": ["<|python_tag|>", '{"name": "f", "parameters": {"a": 1}}', "; ", " ", "x", "{", "<|py"],
    "pythonic": ["<|python_start|>", "<|python_end|>", "[f(a=1)", ", g()]", " ", "x", "[", "<|py"],
    "mistral": ["[TOOL_CALLS]", '[{"name": "f", "arguments": {"a": 1}}]', "f[ARGS]", '{"a": 1}', " ", "x", "[TOOL"],
}
PIECES["deepseek_v31"] = PIECES["deepseek_v3"]
PIECES["qwen3_xml"] = PIECES["qwen3_coder"] = [
    "Sure. ", "<tool_call>", "</tool_call>", "<function=f>", "</function>", "<parameter=a>", "</parameter>", "\n",
    "1", "Paris", "<tool_", "<"]
PIECES["functiongemma"] = ["Sure. ", "<start_function_call>", "<end_function_call>", "call:f{", "a:", "<escape>",
                           "x, {y}", "1", ",", "}", "[", "]", "<start_fun", "<"]
PIECES["xlam"] = ["```json", "```", "[TOOL_CALLS]", "<tool_call>", "</tool_call>", '[{"name": "f", "arguments": {}}]',
                  '{"name": "g", "arguments": {"a": 1}}', " ", "x", "[", "```j"]


# "openai" (harmony) streams through server/openai/harmony_text.py, not a CallScanner: tests/server/test_harmony.py.
@pytest.mark.parametrize("name", [name for name in TOOL_CALL_PARSERS if name != "openai"])
def test_each_step_sends_what_the_whole_text_rules_say(name):
    """Random texts in each format cut at random steps: every step's content end and calls are those the whole
    text so far gives when read from the start, and the finished text's are its final calls."""
    rng = random.Random(name)
    parser = make_tool_parser(name)
    assert parser is not None
    for _ in range(300):
        text = "".join(rng.choice(PIECES[name]) for _ in range(rng.randint(1, 10)))
        scanner = parser.scanner()
        ends = sorted({*rng.sample(range(1, len(text) + 1), rng.randint(1, len(text))), len(text)})
        for end in ends:
            finished = end == len(text)
            content_end, calls = scanner.advance(text[:end], 0, finished)
            assert (content_end, list(calls)) == _whole_text_rule(parser, name, text[:end], finished), text[:end]


def _whole_text_split(text: str, starts_in_reasoning: bool, finished: bool) -> tuple:
    """(reasoning, content) of `text` read from the start (None: none); a possible marker start held back."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_START):
        body = stripped[len(THINK_START):]
    elif not finished and THINK_START.startswith(stripped):
        return None, None
    elif starts_in_reasoning:
        body = text
    else:
        return None, text
    if THINK_END in body:
        reasoning, content = body.split(THINK_END, 1)
        return reasoning, content
    return (body if finished else body[:len(body) - _held_back(body, (THINK_END,))]), None


def test_the_reasoning_stream_agrees_with_the_whole_text_split():
    """Random texts around <think> markers cut at random steps: the stream's reasoning and content spans are
    those the whole text so far gives."""
    rng = random.Random(7)
    pieces = [THINK_START, THINK_END, "<thi", "nk>", "</th", " ", "\n", "hmm", "<"]
    for _ in range(1000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        starts = rng.random() < 0.5
        stream = ReasoningStream(starts)
        for end in sorted({*rng.sample(range(1, len(text) + 1), rng.randint(1, len(text))), len(text)}):
            finished = end == len(text)
            stream.advance(text[:end], finished)
            reasoning = None if stream.reasoning_start is None else \
                text[stream.reasoning_start:stream.reasoning_end]
            content = None if stream.content_start is None else text[stream.content_start:end]
            assert (reasoning, content) == _whole_text_split(text[:end], starts, finished), (text[:end], starts)
