"""openai: gpt-oss's tool calls, commentary messages addressed `to=functions.NAME` in its harmony format
(server/parsers/harmony.py). A chat stream reads harmony through server/openai/harmony_text.py; this parser gives the
same calls to everything that reads a finished text."""

from typing import Optional

from jaxpaged.server.parsers.harmony import split_message
from jaxpaged.server.parsers.tool.base import Call, ToolParser


class HarmonyToolParser(ToolParser):
    """Calls are the addressed commentary messages; content is the final channel's text (and preambles)."""

    name = "openai"
    markers = ("<|channel|>", "<|start|>", "<|message|>")
    keeps_special_tokens = True

    def section_start(self, text: str) -> int:
        return 0 if split_message(text)[2] else -1

    def parse_section(self, section: str) -> Optional[list[Call]]:
        return split_message(section)[2]

    def content(self, text: str) -> Optional[str]:
        return split_message(text)[1] or None
