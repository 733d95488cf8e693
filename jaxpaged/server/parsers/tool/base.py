"""ToolParser: splits a model's text into content and tool calls, for tool_choice "auto".

Every format here has the same shape: free text, then a call section that runs to the end of the output. A parser
says where the section starts (`section_start`) and parses it (`parse_section`); the rest is shared. Parsing is
linear in the text: markers are found with str.find and JSON with raw_decode, never a regex over free text.

A parser sees a sample's whole text so far: while streaming, `stream_content` says how much of it is surely content
(it holds back anything that might start a call); the calls are parsed once the sample ends.
"""

import json
import uuid
from typing import Any, ClassVar, Optional

Call = tuple[str, str]
"""(function name, arguments as JSON text)."""


class ToolParser:
    """The shared part of every format: content before the call section, calls parsed from the section."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    """Strings that open the call section; a partial one at the end of streamed text is held back."""
    keeps_special_tokens: ClassVar[bool] = False
    """The markers are special tokens of the model's tokenizer: requests must keep them in the text."""

    def section_start(self, text: str) -> int:
        """Where the call section starts (-1: none); by default at the first marker."""
        found = [index for index in (text.find(marker) for marker in self.markers) if index >= 0]
        return min(found, default=-1)

    def parse_section(self, section: str) -> Optional[list[Call]]:
        """The calls of a section (from its start to the end of the text); None when it is not well formed."""
        raise NotImplementedError

    def calls(self, text: str) -> list[Call]:
        """The calls of a finished output; [] when it has none or they are malformed (then it is all content, so
        nothing the model wrote is lost)."""
        start = self.section_start(text)
        if start < 0:
            return []
        return self.parse_section(text[start:]) or []

    def stream_calls(self, text: str) -> list[Call]:
        """The calls already complete in a text that may still grow, for a stream to send before the end: the
        first of the final calls(). By default none: a format whose section parses only as a whole waits."""
        return []

    def content(self, text: str) -> Optional[str]:
        """The text besides the calls (None when it is empty and there are calls)."""
        if not self.calls(text):
            return text
        return text[:self.section_start(text)].rstrip() or None

    def stream_content(self, text: str) -> int:
        """How many characters of `text` are surely content: up to a call, or to a possible start of one."""
        start = self.section_start(text)
        if start >= 0:
            return start
        held = 0
        for marker in self.markers:
            for keep in range(min(len(marker) - 1, len(text)), 0, -1):
                if marker.startswith(text[-keep:]):
                    held = max(held, keep)
                    break
        return len(text) - held

    def auto_grammar(self, tools: list[dict]) -> Optional[str]:
        """For tool_choice "auto": a Lark grammar (llguidance's) whose outputs are text, or calls of the declared
        tools in this format with arguments that match their schemas; None where the format has no such grammar
        here (the output is then parsed unconstrained, as vLLM does)."""
        return None

    def call_id(self) -> str:
        """A new tool call id."""
        return f"call_{uuid.uuid4().hex[:24]}"


JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""How a call's JSON is laid out in a grammar (llguidance's x-guidance options): as json.dumps writes it, so a small
model cannot loop on whitespace (sampling/grammar/grammar_compiler.py does the same for response formats)."""


def tool_call_schema(tools: list[dict], arguments_key: str) -> dict:
    """The JSON schema of one call object {"name": <a declared tool>, <arguments_key>: <its parameters>}."""
    calls = [{"type": "object", "properties": {"name": {"const": tool["function"]["name"]},
                                               arguments_key: tool["function"].get("parameters") or
                                               {"type": "object"}},
              "required": ["name", arguments_key], "additionalProperties": False} for tool in tools]
    return {"anyOf": calls, "x-guidance": JSON_LAYOUT}


def arguments_text(arguments: Any) -> str:
    """Arguments as the JSON text OpenAI's tool_calls carry (a string the model wrote is kept as it is)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def decode_json_objects(text: str, separators: str = "") -> Optional[list[Any]]:
    """The JSON values written one after another in `text` (whitespace and `separators` between them); None when
    anything else is there. Linear: json's raw_decode reads each value once."""
    decoder, values, position = json.JSONDecoder(), [], 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] in separators):
            position += 1
        if position == len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            return None
        values.append(value)


def named_call(item: Any, *argument_keys: str) -> Optional[Call]:
    """(name, arguments) of a {"name": ..., <argument key>: {...}} object; None when it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = next((item[key] for key in argument_keys if key in item), {})
    return item["name"], arguments_text(arguments)


def tag_or_leading(text: str, tag: str, opener: str) -> int:
    """Where a call section starts: at `tag`, or where an answer whose first non-space character is `opener`
    begins; -1 when neither."""
    position = text.find(tag)
    if position >= 0:
        return position
    stripped = text.lstrip()
    return len(text) - len(stripped) if stripped.startswith(opener) else -1
