"""The reasoning parsers: `<think>` text split into reasoning and content as vLLM's qwen3 and deepseek_r1 do,
prefix-stable while streaming, and refused by name when unknown or when the model lacks the markers."""

import pytest

from jaxpaged.server.context import ServerSettings
from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.reasoning import check_reasoning_markers, make_reasoning_parser
from jaxpaged.server.parsers.tool import make_tool_parser
from tests.server.call_fragments import delta_entries, merged_calls

QWEN3 = make_reasoning_parser("qwen3")
R1 = make_reasoning_parser("deepseek_r1")


@pytest.mark.parametrize("text, starts, expected", [
    ("<think>\nLet me see.\n</think>\n\nParis.", False, ("\nLet me see.\n", "\n\nParis.")),
    ("Paris.", False, (None, "Paris.")),  # enable_thinking=false: no tags, all content
    ("Let me see.</think>Paris.", True, ("Let me see.", "Paris.")),  # the prompt opened the block
    ("<think>cut off", False, ("cut off", "")),
])
def test_qwen3_splits_reasoning_from_content(text, starts, expected):
    assert QWEN3 is not None and QWEN3.split(text, starts) == expected


@pytest.mark.parametrize("text, expected", [
    ("Hmm.</think>\n\nParis.", ("Hmm.", "\n\nParis.")),
    ("<think>Hmm.</think>Paris.", ("Hmm.", "Paris.")),
    ("Still thinking", ("Still thinking", "")),
])
def test_deepseek_r1_starts_inside_the_reasoning(text, expected):
    assert R1 is not None and R1.split(text, R1.starts_in_reasoning(None)) == expected


def test_the_prompt_says_whether_qwen3_starts_inside_the_reasoning():
    assert QWEN3 is not None
    assert QWEN3.starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not QWEN3.starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("text, starts", [("<think>\nI should call it.\n</think>\n\nSure.<tool_call>\n"
                                           '{"name": "f", "arguments": {"a": 1}}\n</tool_call>', False),
                                          ("x</think>plain <b>", True), ("no thinking at all", False)])
def test_stream_deltas_add_up_to_the_whole_message(text, starts):
    """Reasoning first, then content, then the calls of tool_choice "auto": a character at a time."""
    whole = ChoiceText(ToolCalling([], None, make_tool_parser("hermes")), QWEN3, starts).message(text)
    choice = ChoiceText(ToolCalling([], None, make_tool_parser("hermes")), QWEN3, starts)
    deltas = [choice.delta(text[:end], end == len(text)) for end in range(1, len(text) + 1)]
    reasoning = "".join(d.get("reasoning", "") for d in deltas)
    assert reasoning == (whole["reasoning"] or "")
    assert "".join(d.get("content", "") for d in deltas).rstrip() == (whole["content"] or "")
    calls = [(call["name"], call["arguments"]) for call in merged_calls(delta_entries(deltas))]
    assert calls == [(call["function"]["name"], call["function"]["arguments"]) for call in whole.get("tool_calls", [])]
    seen_content = False
    for delta in deltas:  # no reasoning after content started
        seen_content = seen_content or "content" in delta
        assert not (seen_content and "reasoning" in delta)


def test_unknown_parsers_and_missing_markers_are_refused_by_name():
    with pytest.raises(ValueError, match="^reasoning_parser: unknown parser 'ponder'; --reasoning-parser takes"):
        ServerSettings(reasoning_parser="ponder")
    with pytest.raises(ValueError, match="^reasoning_parser: vLLM's parser 'granite' is not implemented"):
        ServerSettings(reasoning_parser="granite")

    class NoThinking:
        chat_template = "{{ messages }}"

        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(ValueError, match="^reasoning_parser: --reasoning-parser qwen3 needs a model that writes"):
        check_reasoning_markers("qwen3", NoThinking(), None)
    check_reasoning_markers("qwen3", NoThinking(), "{% if x %}<think>{% endif %}</think>")  # the template has them


def test_mistral_reads_think_brackets_whole_and_streamed():
    """Magistral's `[THINK] ... [/THINK]`: split as qwen3 splits `<think>`, streamed a character at a time to the same
    message; its markers are special tokens, so the text must keep them; a schema waits for `[/THINK]`."""
    mistral = make_reasoning_parser("mistral")
    assert mistral is not None and mistral.keeps_special_tokens and mistral.end == "[/THINK]"
    text = "[THINK]Paris is in France.[/THINK]The capital is Paris."
    assert mistral.split(text, False) == ("Paris is in France.", "The capital is Paris.")
    assert mistral.split("<think>not these markers</think>", False) == (None, "<think>not these markers</think>")
    choice = ChoiceText(None, mistral, False)
    deltas = [choice.delta(text[:end], end == len(text)) for end in range(1, len(text) + 1)]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Paris is in France."
    assert "".join(d.get("content", "") for d in deltas) == "The capital is Paris."
    assert mistral.starts_in_reasoning("[INST]hi[/INST][THINK]") and mistral.ended_in_prompt("...[/THINK]\n")
