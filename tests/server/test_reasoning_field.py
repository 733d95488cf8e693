"""The reasoning under vLLM's current field name: `reasoning` in messages and deltas (vLLM removed
`reasoning_content`), include_reasoning=false drops it, and an assistant message's `reasoning` (or its former name
`reasoning_content`) reaches the chat template."""

import pytest

from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.prompts import _message_dict
from jaxpaged.server.openai.protocol import ChatCompletionRequest, ChatMessage
from jaxpaged.server.parsers.reasoning import make_reasoning_parser

QWEN3 = make_reasoning_parser("qwen3")
TEXT = "<think>\nLet me see.\n</think>\n\nParis."


def test_the_message_and_the_deltas_carry_reasoning_under_vllm_s_name():
    """`reasoning` holds the think text, whole and streamed; `reasoning_content` is gone as in vLLM."""
    message = ChoiceText(None, QWEN3, False).message(TEXT)
    assert message["reasoning"] == "\nLet me see.\n" and message["content"] == "\n\nParis."
    assert "reasoning_content" not in message
    choice = ChoiceText(None, QWEN3, False)
    deltas = [choice.delta(TEXT[:end], end == len(TEXT)) for end in range(1, len(TEXT) + 1)]
    assert "".join(delta.get("reasoning", "") for delta in deltas) == "\nLet me see.\n"
    assert not any("reasoning_content" in delta for delta in deltas)


def test_include_reasoning_false_drops_the_reasoning_and_keeps_the_content():
    """vLLM's include_reasoning=false: no reasoning field; the content is the same as with it."""
    message = ChoiceText(None, QWEN3, False, include_reasoning=False).message(TEXT)
    assert "reasoning" not in message and message["content"] == "\n\nParis."
    choice = ChoiceText(None, QWEN3, False, include_reasoning=False)
    deltas = [choice.delta(TEXT[:end], end == len(TEXT)) for end in range(1, len(TEXT) + 1)]
    assert not any("reasoning" in delta for delta in deltas)
    assert "".join(delta.get("content", "") for delta in deltas) == "\n\nParis."


def test_include_reasoning_is_a_request_key():
    """include_reasoning parses (defaulting to true) instead of answering 400 as an unknown key."""
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest.model_validate(base).include_reasoning
    assert not ChatCompletionRequest.model_validate({**base, "include_reasoning": False}).include_reasoning


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_an_assistant_message_s_reasoning_reaches_the_template_under_both_names(field):
    """Interleaved thinking: templates read reasoning or reasoning_content; clients send either."""
    rendered = _message_dict(ChatMessage.model_validate({"role": "assistant", "content": "Paris.", field: "hm"}))
    assert rendered["reasoning"] == rendered["reasoning_content"] == "hm"


def test_reasoning_wins_over_its_former_name():
    """Both given: `reasoning`, vLLM's current name, is the one passed on."""
    message = ChatMessage.model_validate({"role": "assistant", "content": "x", "reasoning": "new",
                                          "reasoning_content": "old"})
    assert _message_dict(message)["reasoning"] == "new"
    assert "reasoning" not in _message_dict(ChatMessage.model_validate({"role": "user", "content": "x"}))


def _params_with(structured):
    from jaxpaged.sampling.params import SamplingParams
    return SamplingParams(max_tokens=8, structured_outputs=structured)


def test_a_schema_waits_for_the_reasoning_to_end_unless_the_prompt_closed_it():
    """With a reasoning parser a response_format schema holds after `</think>` (the model thinks first, as in vLLM);
    a prompt that closed the reasoning (thinking off) or a tool call's grammar starts at the first token."""
    from jaxpaged.sampling.params import StructuredOutputsParams
    from jaxpaged.server.openai.chat import _grammar_after_reasoning
    from jaxpaged.server.openai.tool_calls import ToolCalling

    params = _params_with(StructuredOutputsParams(json={"type": "object"}, origin="response_format"))
    waiting = _grammar_after_reasoning(params, QWEN3, None, "<|im_start|>assistant\n")
    assert waiting.structured_outputs is not None and waiting.structured_outputs.starts_after == "</think>"
    closed = _grammar_after_reasoning(params, QWEN3, None, "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert closed.structured_outputs is not None and closed.structured_outputs.starts_after is None
    forced = _grammar_after_reasoning(params, QWEN3, ToolCalling([], "f"), "<|im_start|>assistant\n")
    assert forced.structured_outputs is not None and forced.structured_outputs.starts_after is None
    assert _grammar_after_reasoning(params, None, None, "x") is params
