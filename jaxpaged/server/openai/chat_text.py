"""ChoiceText: what one chat choice's text says (reasoning, content, tool calls), whole or as stream deltas.

The model's text passes through two optional parsers, in order: the reasoning parser splits off `<think>` text
(`reasoning`, vLLM's current name: it dropped `reasoning_content`, vllm#27752 and #33402), then the tool parser of
tool_choice "auto" splits calls from the rest (content). While
streaming, each part goes out as soon as it is sure; the deltas add up to the whole response. A stream keeps each
parser's place in the text (a ReasoningStream, a CallScanner), so a step costs what its new text costs, not what the
whole text does.
"""

from typing import Optional

from jaxpaged.server.openai.call_deltas import CallDeltas
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.reasoning import ReasoningParser, ReasoningStream
from jaxpaged.server.parsers.tool.scanner import CallScanner


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
        self.call_deltas: Optional[CallDeltas] = None if calling is None else CallDeltas(calling)
        """What a stream has sent of each "auto" call (its name, then its arguments as they are written)."""
        self.num_calls_sent = 0
        """Tool calls a stream has begun to send; once the text ended, the calls the finished text holds (what
        finish_reason "tool_calls" says: a malformed call a stream began does not count)."""
        self.reasoning_stream: Optional[ReasoningStream] = None if reasoning is None else \
            reasoning.stream(starts_in_reasoning)
        """Where a stream's reasoning and content are (None without a reasoning parser: all content)."""
        self.scanner: Optional[CallScanner] = None
        """The tool parser's place in a stream's content (None without one, or before the content starts)."""

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
        """The stream delta since the last call: new reasoning, new sure content, and the calls' new parts (a call's
        name once whole, then its arguments as written) (`text`: the choice's whole text so far, which only grows;
        looked at from where the last call stopped)."""
        delta: dict = {}
        content_start: Optional[int] = 0
        if self.reasoning_stream is not None:
            stream = self.reasoning_stream
            stream.advance(text, finished)
            if stream.reasoning_start is not None and stream.reasoning_end - stream.reasoning_start > \
                    self._reasoning_sent:
                if self.include_reasoning:
                    delta["reasoning"] = text[stream.reasoning_start + self._reasoning_sent:stream.reasoning_end]
                self._reasoning_sent = stream.reasoning_end - stream.reasoning_start
            content_start = stream.content_start
        if content_start is None:
            return delta  # no content yet
        calls: list[tuple[str, str]] = []
        end = len(text)
        if self.calling is not None and self.calling.parser is not None:
            if self.scanner is None:
                self.scanner = self.calling.parser.scanner()
            end, calls = self.scanner.advance(text, content_start, finished)
            calls = self.calling.limited(calls)
        if end - content_start > self._content_sent:
            delta["content"] = text[content_start + self._content_sent:end]
            self._content_sent = end - content_start
        if self.call_deltas is not None and self.scanner is not None:
            entries = self.call_deltas.final(calls) if finished else \
                self.call_deltas.step(self.call_deltas.calling.limited(self.scanner.drafts))
            if entries:
                delta["tool_calls"] = entries
            self.num_calls_sent = len(calls) if finished else self.call_deltas.num_started
        return delta
