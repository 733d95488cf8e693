"""llama3_json: Llama 3.1 / 3.2 JSON tool calls: `{"name": ..., "parameters": {...}}` as the whole answer, several
separated by `;`, optionally after the `<|python_tag|>` token."""

import json
from typing import Optional

from jaxpaged.server.parsers.tool.base import (
    Call,
    ToolParser,
    decode_json_objects,
    named_call,
    tool_call_schema,
)
from jaxpaged.server.parsers.tool.call_reader import CallReader


class Llama3JsonToolParser(ToolParser):
    """An answer that starts with `{` (or holds `<|python_tag|>`) is calls; anything else is content."""

    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    markers = (PYTHON_TAG,)
    opener = "{"

    def parse_section(self, section: str) -> Optional[list[Call]]:
        body = section[len(self.PYTHON_TAG):] if section.startswith(self.PYTHON_TAG) else section
        items = decode_json_objects(body, separators=";")
        calls = [named_call(item, "parameters", "arguments") for item in items or []]
        return [call for call in calls if call is not None] if items and all(calls) else None

    def section_reader(self, text: str, start: int) -> Optional[CallReader]:
        if text.startswith(self.PYTHON_TAG, start):
            start += len(self.PYTHON_TAG)
        return CallReader(start, ("parameters", "arguments"), separators=";")

    def auto_grammar(self, tools: list[dict]) -> Optional[str]:
        # Text that neither opens with `{` nor writes the tag, or calls as the whole answer (written without the
        # tag, as Llama 3.1 writes calls to the user's own tools).
        call = json.dumps(tool_call_schema(tools, "parameters"))
        return "\n".join([
            "start: TEXT | call (\"; \" call)*",
            r"TEXT: /(?s:.+)/ & ~/(?s:\s*\{.*)/ & ~/(?s:.*<\|python_tag\|>.*)/",
            f"call: %json {call}"])
