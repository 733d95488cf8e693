"""gpt-oss's harmony format (--reasoning-parser openai_gptoss, --tool-call-parser openai): hand-written outputs split
into reasoning, content and calls, whole and a few characters at a time (the deltas add up to the whole message),
with linear work on a long output."""

import json

import pytest

from jaxpaged.server.openai.harmony_text import HarmonyText, choice_text
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.harmony import split_message
from jaxpaged.server.parsers.reasoning import make_reasoning_parser
from jaxpaged.server.parsers.tool import make_tool_parser

ANSWER = ("<|channel|>analysis<|message|>The user wants the weather.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>")
CALLING = ("<|channel|>analysis<|message|>I need the tool.<|end|>"
           "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
           '{"city": "Paris"}<|call|>'
           "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>"
           '{"timezone": "CET"}<|call|>')
PREAMBLE = ("<|channel|>commentary<|message|>Let me check. <|end|>"
            "<|start|>assistant<|channel|>final<|message|>Done.")  # cut off before <|return|> (the EOS)


def _calling(max_calls=None) -> ToolCalling:
    return ToolCalling([], None, make_tool_parser("openai"), max_calls)


def _streamed(text_reader, text: str, step: int) -> list[dict]:
    ends = [*range(step, len(text), step), len(text)]
    return [text_reader.delta(text[:end], end == len(text)) for end in ends]


def test_channels_split_into_reasoning_content_and_calls():
    """Hand-worked: analysis is the reasoning, final (and a preamble) the content, addressed commentary the calls
    (recipient in the header before or after the channel), an unterminated last message whole."""
    assert split_message(ANSWER) == ("The user wants the weather.", "It is sunny in Paris.", [])
    assert split_message(CALLING) == ("I need the tool.", "", [("get_weather", '{"city": "Paris"}'),
                                                              ("get_time", '{"timezone": "CET"}')])
    assert split_message(PREAMBLE) == ("", "Let me check. Done.", [])


@pytest.mark.parametrize("text", [ANSWER, CALLING, PREAMBLE])
@pytest.mark.parametrize("step", [1, 3, 7])
def test_stream_deltas_add_up_to_the_whole_message(text, step):
    """Streamed a few characters at a time: reasoning, content and calls add up to the non-streamed message, and
    no marker text leaks into either field."""
    whole = HarmonyText(_calling()).message(text)
    deltas = _streamed(HarmonyText(_calling()), text, step)
    assert "".join(d.get("reasoning", "") for d in deltas) == (whole["reasoning"] or "")
    content = "".join(d.get("content", "") for d in deltas)
    assert content == (whole["content"] or "") and "<|" not in content
    streamed = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for d in deltas for c in d.get("tool_calls", [])]
    assert streamed == [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                        for c in whole.get("tool_calls", [])]


def test_parallel_tool_calls_false_and_no_tools():
    """One call at most with parallel_tool_calls false; without tools an addressed message is text, not lost."""
    limited = HarmonyText(_calling(max_calls=1))
    assert [c["function"]["name"] for c in limited.message(CALLING)["tool_calls"]] == ["get_weather"]
    streamed = [c for d in _streamed(HarmonyText(_calling(max_calls=1)), CALLING, 5) for c in d.get("tool_calls", [])]
    assert [c["function"]["name"] for c in streamed] == ["get_weather"]
    plain = HarmonyText(None).message(CALLING)
    assert "tool_calls" not in plain and '{"city": "Paris"}' in plain["content"]


def test_either_harmony_parser_selects_the_harmony_reader():
    """--reasoning-parser openai_gptoss or --tool-call-parser openai read harmony; qwen3 keeps its <think> reader;
    both harmony parsers keep special tokens (the markers are special tokens)."""
    gptoss = make_reasoning_parser("openai_gptoss")
    assert gptoss is not None and gptoss.keeps_special_tokens and gptoss.end == "<|channel|>final<|message|>"
    assert isinstance(choice_text(None, gptoss, False, True), HarmonyText)
    assert isinstance(choice_text(_calling(), None, False, True), HarmonyText)
    assert not isinstance(choice_text(None, make_reasoning_parser("qwen3"), False, True), HarmonyText)
    parser = make_tool_parser("openai")
    assert parser is not None and parser.keeps_special_tokens
    assert parser.calls(CALLING) == [("get_weather", '{"city": "Paris"}'), ("get_time", '{"timezone": "CET"}')]
    assert parser.content(ANSWER) == "It is sunny in Paris."


def test_a_long_streamed_output_costs_linear_work():
    """128k characters of analysis then an answer, 4 at a time: each character is looked at a few times."""
    reasoning = "thinking <b>hard</b> " * 6000
    text = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final<|message|>Yes."
    reader = HarmonyText(None)
    deltas = _streamed(reader, text, 4)
    assert reader.stream.num_scanned <= 4 * len(text)
    assert "".join(d.get("reasoning", "") for d in deltas) == reasoning
    assert "".join(d.get("content", "") for d in deltas) == "Yes."
