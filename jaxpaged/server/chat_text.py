"""ChoiceText: what one chat choice's text says (reasoning, content, tool calls), whole or as stream deltas.

The model's text passes through two optional parsers, in order: the reasoning parser splits off `<think>` text
(`reasoning`, vLLM's current name: it dropped `reasoning_content`, vllm#27752 and #33402), then the tool parser of
tool_choice "auto" splits calls from the rest (content). While streaming, each part goes out as soon as it is
sure; the deltas add up to the whole response.
"""

from typing import Optional

from jaxpaged.server.reasoning_parsers import ReasoningParser
from jaxpaged.server.tool_calls import ToolCalling


class ChoiceText:
    """One choice's text as OpenAI message fields; `calling` is None or tool_choice "auto" (it has a parser)."""

    def __init__(self, calling: Optional[ToolCalling], reasoning: Optional[ReasoningParser],
                 starts_in_reasoning: bool, include_reasoning: bool = True) -> None:
        assert calling is None or calling.parser is not None
        self.calling, self.reasoning, self.starts_in_reasoning = calling, reasoning, starts_in_reasoning
        self.include_reasoning = include_reasoning
        """False (the request's include_reasoning): the reasoning is split off and dropped."""
        self._reasoning_sent = 0
        self._content_sent = 0
        self.num_calls_sent = 0
        """Tool calls already streamed (each in one delta, as soon as the parser knows it complete)."""

    def _split(self, text: str, finished: bool) -> tuple[Optional[str], str]:
        if self.reasoning is None:
            return None, text
        return self.reasoning.split(text, self.starts_in_reasoning, finished)

    def message(self, text: str) -> dict:
        """The non-streaming message of a finished choice."""
        reasoning, content = self._split(text, finished=True)
        message: dict = {"role": "assistant", "content": content}
        if self.reasoning is not None:
            if self.include_reasoning:
                message["reasoning"] = reasoning
            if reasoning is not None and not content:
                message["content"] = None
        calls = self.calling.calls(content) if self.calling is not None else []
        if calls:
            assert self.calling is not None and self.calling.parser is not None
            message["content"] = self.calling.parser.content(content)
            message["tool_calls"] = calls
        return message

    def delta(self, text: str, finished: bool) -> dict:
        """The stream delta since the last call: new reasoning, new sure content, and (at the end) the calls."""
        reasoning, content = self._split(text, finished)
        delta: dict = {}
        if reasoning is not None and len(reasoning) > self._reasoning_sent and self.include_reasoning:
            delta["reasoning"] = reasoning[self._reasoning_sent:]
            self._reasoning_sent = len(reasoning)
        calls: list[tuple[str, str]] = []
        if self.calling is None or self.calling.parser is None:
            end = len(content)
        else:
            parser = self.calling.parser
            calls = parser.calls(content) if finished else parser.stream_calls(content)
            end = len(content) if finished and not calls else parser.stream_content(content)
        if end > self._content_sent:
            delta["content"] = content[self._content_sent:end]
            self._content_sent = end
        if len(calls) > self.num_calls_sent:
            assert self.calling is not None
            delta["tool_calls"] = [{"index": index, **self.calling.call(*calls[index])}
                                   for index in range(self.num_calls_sent, len(calls))]
            self.num_calls_sent = len(calls)
        return delta
