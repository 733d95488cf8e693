"""hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, as Hermes, Qwen 2.5 / Qwen 3 and their
chat templates write them."""

import json
from typing import Optional

from jaxpaged.server.parsers.tool.base import Call, ToolParser, named_call, tool_call_schema


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

    def auto_grammar(self, tools: list[dict]) -> Optional[str]:
        # Text that never writes the start tag, or text (reasoning, a preamble) up to the first start tag and then
        # only well-formed blocks, as Qwen's templates lay them out. NOTE: `before` is lazy (it ends at the first
        # start tag); a greedy text lexeme would never hand over to the block, llguidance's lexer being
        # deterministic.
        call = json.dumps(tool_call_schema(tools, "arguments"))
        return "\n".join([
            "start: TEXT | before blocks",
            f"TEXT: /(?s:.+)/ & ~/(?s:.*{self.START}.*)/",
            f'before[stop="{self.START}"]: /(?s:.*)/',
            f'blocks: "\\n" call "\\n{self.END}" ("\\n{self.START}\\n" call "\\n{self.END}")*',
            f"call: %json {call}"])

    def stream_calls(self, text: str) -> list[Call]:
        # Blocks are read alike in a prefix that ends after an end tag and in the whole text.
        end = text.rfind(self.END)
        return self.calls(text[:end + len(self.END)]) if end >= 0 else []
