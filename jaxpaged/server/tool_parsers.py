"""Parsers of a model's own tool-call syntax, for tool_choice "auto": the model decides whether to call a tool,
and its text is split into content and OpenAI tool_calls.

  - "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, as Hermes, Qwen 2.5 / Qwen 3 and
    their chat templates write them.

A parser sees the sample's whole text so far: while streaming, `stream_content` says how much of it is content
that can go out now (it holds back anything that might start a call); the calls are parsed once the sample ends.
"""

import json
import re
from typing import Optional

TOOL_CALL_PARSERS = ("hermes",)
"""The names `--tool-call-parser` accepts."""


class HermesToolParser:
    """`<tool_call>` JSON blocks; text before the first block is content."""

    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def content(self, text: str) -> Optional[str]:
        """The text before the first call (None when it is empty and there are calls)."""
        head, start, _ = text.partition(self.START)
        if not start:
            return text
        return head.rstrip() or None

    def stream_content(self, text: str) -> int:
        """How many characters of `text` are surely content: up to a call, or to a possible start of one."""
        start = text.find(self.START)
        if start >= 0:
            return start
        for keep in range(min(len(self.START) - 1, len(text)), 0, -1):
            if self.START.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)

    def calls(self, text: str) -> list[tuple[str, str]]:
        """(name, arguments as JSON text) of every well-formed call; a malformed block stays out (it is in the
        content instead, so nothing the model wrote is lost)."""
        calls = []
        for body in self._BLOCK.findall(text):
            try:
                item = json.loads(body)
                name, arguments = item["name"], item.get("arguments", item.get("parameters", {}))
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(name, str):
                calls.append((name, arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                                            ensure_ascii=False)))
        return calls


def make_tool_parser(name: Optional[str]) -> Optional[HermesToolParser]:
    """The parser called `name` (None: no parser); ValueError naming the flag for an unknown one."""
    if name is None:
        return None
    if name == "hermes":
        return HermesToolParser()
    raise ValueError(f"tool_call_parser: must be one of {list(TOOL_CALL_PARSERS)}, got {name!r}")
