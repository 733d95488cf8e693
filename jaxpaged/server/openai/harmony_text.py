"""HarmonyText: one chat choice's text in gpt-oss's harmony format (server/parsers/harmony.py) as OpenAI message
fields, whole or as stream deltas: the analysis channel is `reasoning`, the final channel and preambles `content`,
addressed commentary messages `tool_calls` (with tool_choice "auto" and tools; without tools they are content)."""

from typing import Optional

from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.harmony import HarmonyStream, split_message
from jaxpaged.server.parsers.reasoning import ReasoningParser

HARMONY_PARSERS = ("openai_gptoss", "openai")
"""The reasoning and tool-call parser names (vLLM's) that read the harmony format."""


class HarmonyText(ChoiceText):
    """ChoiceText's interface over harmony messages instead of `<think>` markers and a tool parser."""

    def __init__(self, calling: Optional[ToolCalling], include_reasoning: bool = True) -> None:
        super().__init__(None, None, False, include_reasoning)
        self.harmony_calling = calling
        self.stream = HarmonyStream()
        self._index = 0  # the message being streamed
        self._sent = 0  # characters of its body already sent

    def _calls(self, calls: list[tuple[str, str]]) -> list[dict]:
        assert self.harmony_calling is not None
        return [self.harmony_calling.call(name, arguments) for name, arguments in self.harmony_calling.limited(calls)]

    def message(self, text: str) -> dict:
        """The non-streaming message of a finished choice."""
        reasoning, content, calls = split_message(text)
        if self.harmony_calling is None:  # no tools asked for: an addressed message is text like any other
            content += "".join(arguments for _, arguments in calls)
            calls = []
        message: dict = {"role": "assistant", "content": content or None}
        if self.include_reasoning:
            message["reasoning"] = reasoning or None
        if calls:
            message["tool_calls"] = self._calls(calls)
        elif message["content"] is None:
            message["content"] = ""
        return message

    def delta(self, text: str, finished: bool) -> dict:
        """What the stream gained since the last call: reasoning and content as their bodies grow, each call once its
        message closes."""
        sure_end = self.stream.advance(text, finished)
        delta: dict = {}
        messages = self.stream.messages
        while self._index < len(messages):
            message = messages[self._index]
            closed = message.body_end >= 0
            end = message.body_end if closed else sure_end
            kind = message.kind if self.harmony_calling is not None or message.kind != "call" else "content"
            if kind == "call":
                calling = self.harmony_calling
                assert calling is not None
                if closed and (calling.max_calls is None or self.num_calls_sent < calling.max_calls):
                    call = calling.call(message.function or "", text[message.body_start:end].strip())
                    delta.setdefault("tool_calls", []).append({"index": self.num_calls_sent, **call})
                    self.num_calls_sent += 1
            else:
                new = text[message.body_start + self._sent:end]
                if new and (kind == "content" or self.include_reasoning):
                    field = "content" if kind == "content" else "reasoning"
                    delta[field] = delta.get(field, "") + new
                self._sent = max(self._sent, end - message.body_start)
            if not closed:
                break
            self._index, self._sent = self._index + 1, 0
        return delta


def choice_text(calling: Optional[ToolCalling], reasoning: Optional[ReasoningParser], starts_in_reasoning: bool,
                include_reasoning: bool) -> ChoiceText:
    """How one choice's text reads: harmony messages when either parser is gpt-oss's, else `<think>` markers and
    the tool parser."""
    harmony_tools = calling is not None and calling.parser is not None and calling.parser.name == "openai"
    if harmony_tools or (reasoning is not None and reasoning.harmony):
        return HarmonyText(calling, include_reasoning)
    return ChoiceText(calling, reasoning, starts_in_reasoning, include_reasoning)
