"""JSON a model wrote, decoded without recursing past a fixed depth.

Python's json decoder recurses once per level of nesting, so text such as `[[[[...` (100,000 levels, unterminated)
raises RecursionError before it can say the JSON is malformed. Model output is checked first by an iterative scan
that counts the brackets outside strings; text nested deeper than MAX_JSON_DEPTH is refused as malformed (the caller
keeps it as content), and RecursionError is caught as a last line.
"""

import json
import re
from typing import Any, Optional

MAX_JSON_DEPTH = 128
"""Most levels of nesting a tool call's JSON may have (a call's arguments follow the tool's schema, itself at most
grammar_compiler.MAX_SCHEMA_DEPTH levels): well below Python's recursion limit, whatever the caller's stack."""

# A string (to its closing quote, or to the end of an unterminated one: the optional quote keeps the scan linear),
# or a bracket. NOTE: the string form is the unrolled loop [^"\\]*(\\.[^"\\]*)*, which never backtracks.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
_NON_SPACE = re.compile(r"\S")


def nested_too_deep(text: str, start: int = 0, end: Optional[int] = None, *, first_value_only: bool = False,
                    max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON in text[start:end] opens more than `max_depth` brackets at once (outside strings);
    `first_value_only`: looks only at the value that begins at `start` (what raw_decode reads), not what follows.

    Iterative and linear; text with few brackets is cleared by counting them, without the scan.
    """
    end = len(text) if end is None else end
    if text.count("{", start, end) + text.count("[", start, end) <= max_depth:
        return False
    if first_value_only:
        first = _NON_SPACE.search(text, start, end)
        if first is None or first.group() not in "[{":
            return False  # a scalar, which decodes without recursing (or no value at all)
    depth = 0
    for token in _STRING_OR_BRACKET.finditer(text, start, end):
        char = text[token.start()]
        if char in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif char in "]}" and depth > 0:
            depth -= 1
            if depth == 0 and first_value_only:
                return False  # the first value closed within the limit
    return False


def load_json(text: str) -> Any:
    """json.loads for model output; ValueError when it is malformed or nested deeper than MAX_JSON_DEPTH."""
    if nested_too_deep(text):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError:  # the last line: the check above should have refused it
        raise ValueError("JSON nested too deep to decode") from None


def raw_decode_json(decoder: json.JSONDecoder, text: str, position: int = 0) -> tuple[Any, int]:
    """decoder.raw_decode for model output (the first value at `position`, and where it ends); ValueError when it
    is malformed or the text from `position` is nested deeper than MAX_JSON_DEPTH."""
    if nested_too_deep(text, position, first_value_only=True):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return decoder.raw_decode(text, position)
    except RecursionError:
        raise ValueError("JSON nested too deep to decode") from None
