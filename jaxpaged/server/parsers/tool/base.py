"""ToolParser: splits a model's text into content and tool calls, for tool_choice "auto".

Every format here has the same shape: free text, then a call section that runs to the end of the output. A parser
says where the section starts (`section_start`) and parses it (`parse_section`); the rest is shared. Parsing is
linear in the text: markers are found with str.find and JSON with raw_decode, never a regex over free text.

A stream reads a sample's text through the parser's CallScanner (scanner.py), which keeps its place between steps:
it says how much of the text is surely content (it holds back anything that might start a call) and which calls are
complete, looking only at what is new. JSON is decoded with json_depth.py's guards: text nested too deep is
malformed, never a RecursionError.
"""

import json
import uuid
from typing import Any, ClassVar, Optional

from jaxpaged.server.parsers.tool.call_reader import CallReader
from jaxpaged.server.parsers.tool.json_depth import nested_too_deep
from jaxpaged.server.parsers.tool.scanner import Call, CallScanner


class ToolParser:
    """The shared part of every format: content before the call section, calls parsed from the section."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    """Strings that open the call section; a partial one at the end of streamed text is held back."""
    opener: ClassVar[Optional[str]] = None
    """When set, an answer whose first non-space character is this is a call section too (without a marker)."""
    keeps_special_tokens: ClassVar[bool] = False
    """The markers are special tokens of the model's tokenizer: requests must keep them in the text."""
    scanner_class: ClassVar[type[CallScanner]] = CallScanner
    """How a stream reads this format (a subclass sends calls before the end)."""

    def scanner(self) -> CallScanner:
        """A new stream's scanner (one per streamed choice)."""
        return self.scanner_class(self)

    def section_start(self, text: str) -> int:
        """Where the call section starts (-1: none): at the first marker, or else, for a format with an opener,
        where an answer whose first non-space character is the opener begins."""
        found = [index for index in (text.find(marker) for marker in self.markers) if index >= 0]
        if found or self.opener is None:
            return min(found, default=-1)
        stripped = text.lstrip()
        return len(text) - len(stripped) if stripped.startswith(self.opener) else -1

    def parse_section(self, section: str) -> Optional[list[Call]]:
        """The calls of a section (from its start to the end of the text); None when it is not well formed."""
        raise NotImplementedError

    def section_reader(self, text: str, start: int) -> Optional[CallReader]:
        """For a stream: a reader of the calls' JSON in the section that starts at text[start], which sends each
        call's arguments as they are written; None (the default) where the calls are sent whole."""
        return None

    def calls(self, text: str) -> list[Call]:
        """The calls of a finished output; [] when it has none or they are malformed (then it is all content, so
        nothing the model wrote is lost)."""
        start = self.section_start(text)
        if start < 0:
            return []
        return self.parse_section(text[start:]) or []

    def stream_calls(self, text: str) -> list[Call]:
        """The calls already complete in a text that may still grow, for a stream to send before the end: the
        first of the final calls(). None yet for a format whose section parses only as a whole. (A stream keeps
        a scanner() instead, which reads only what is new at each step.)"""
        return self.scanner().advance(text)[1]

    def content(self, text: str) -> Optional[str]:
        """The text besides the calls (None when it is empty and there are calls)."""
        if not self.calls(text):
            return text
        return text[:self.section_start(text)].rstrip() or None

    def stream_content(self, text: str) -> int:
        """How many characters of `text` are surely content: up to a call, or to a possible start of one."""
        return self.scanner().advance(text)[0]

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
    anything else is there, or they nest too deep. Linear: json's raw_decode reads each value once."""
    if nested_too_deep(text):
        return None
    decoder, values, position = json.JSONDecoder(), [], 0
    while True:
        while position < len(text) and (text[position].isspace() or text[position] in separators):
            position += 1
        if position == len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):  # RecursionError: the last line, nested_too_deep cleared it
            return None
        values.append(value)


def named_call(item: Any, *argument_keys: str) -> Optional[Call]:
    """(name, arguments) of a {"name": ..., <argument key>: {...}} object; None when it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = next((item[key] for key in argument_keys if key in item), {})
    return item["name"], arguments_text(arguments)
