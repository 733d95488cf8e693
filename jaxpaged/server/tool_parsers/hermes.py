"""hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, as Hermes, Qwen 2.5 / Qwen 3 and their
chat templates write them."""

import json
from typing import Optional

from jaxpaged.server.tool_parsers.base import Call, ToolParser, named_call


class HermesToolParser(ToolParser):
    """`<tool_call>` JSON blocks; text before the first block is content. A block cut off before its end tag still
    counts when its JSON is whole; a malformed block is left out."""

    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    markers = (START,)

    def parse_section(self, section: str) -> Optional[list[Call]]:
        calls, position = [], 0
        while (start := section.find(self.START, position)) >= 0:
            body_start = start + len(self.START)
            end = section.find(self.END, body_start)
            body = section[body_start:] if end < 0 else section[body_start:end]
            position = len(section) if end < 0 else end + len(self.END)
            try:
                call = named_call(json.loads(body), "arguments", "parameters")
            except ValueError:
                call = None
            if call is not None:
                calls.append(call)
        return calls

    def stream_calls(self, text: str) -> list[Call]:
        # Blocks are read alike in a prefix that ends after an end tag and in the whole text.
        end = text.rfind(self.END)
        return self.calls(text[:end + len(self.END)]) if end >= 0 else []
