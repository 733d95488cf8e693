"""JsonLexer: the tokens of JSON text that is still being written, each as soon as it is whole.

A stream that sends a tool call's arguments as the model writes them reads the call's JSON a piece at a time. The
lexer keeps its place in the growing text (it never reads a character twice, save a number or literal cut off at the
end), decodes strings as json.loads does (escapes, surrogate pairs) and hands numbers and literals over in the form
json.dumps writes them, so that what a stream sends adds up to what the finished text parses to.
"""

import json
import re
from typing import Optional

Token = tuple[str, str]
"""(kind, text). Kinds: "{", "}", "[", "]", ",", ":" (text: the character); "open" / "close" (a string's quotes);
"chars" (decoded characters of the open string); "scalar" (a number or literal, as json.dumps writes it); "other" (a
character no JSON token starts with, outside strings); "bad" (text json.loads refuses)."""

_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # string characters that stand for themselves
_WORD = re.compile(r"[A-Za-z0-9+\-.]*")  # a number or a literal (true, null, NaN, -Infinity, ...)
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WORD_START = "-0123456789tfnNI"
_JSON_SPACE = " \t\n\r"


def scalar_text(word: str) -> Optional[str]:
    """A number or literal as json.dumps writes the value json.loads reads from it (None: not one)."""
    try:
        value = json.loads(word)
    except ValueError:
        return None
    return json.dumps(value) if value is None or isinstance(value, (bool, int, float)) else None


def _hex_at(text: str, position: int) -> Optional[int]:
    match = _HEX4.match(text, position)
    return int(match.group(), 16) if match else None


def decode_escape(text: str, position: int, end: int) -> tuple[Optional[str], int]:
    """The characters of the escape at text[position] (a backslash) and its length; (None, 0) when it is cut off at
    `end`, (None, -1) when it is malformed. A high surrogate takes the low one that follows, as json.loads does."""
    if position + 1 >= end:
        return None, 0
    kind = text[position + 1]
    if kind in _ESCAPES:
        return _ESCAPES[kind], 2
    if kind != "u":
        return None, -1
    if position + 6 > end:
        return None, 0
    code = _hex_at(text, position + 2)
    if code is None:
        return None, -1
    if not 0xD800 <= code <= 0xDBFF:
        return chr(code), 6
    following = text[position + 6:min(position + 8, end)]
    if not "\\u".startswith(following):
        return chr(code), 6  # a lone high surrogate (json.loads keeps it)
    if len(following) < 2 or position + 12 > end:
        return None, 0  # a low surrogate may follow
    low = _hex_at(text, position + 8)
    if low is None:
        return None, -1
    if 0xDC00 <= low <= 0xDFFF:
        return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
    return chr(code), 6


class JsonLexer:
    """Tokens of text[position:] as it grows (one lexer per piece of JSON; `position` only moves forward)."""

    def __init__(self, position: int) -> None:
        self.position = position
        """Where the next token starts (or the string being read continues)."""
        self._in_string = False
        self._word_start = -1  # a number or literal being read, cut off at the end of the text so far

    def read(self, text: str, end: int, finished: bool = False) -> list[Token]:
        """The tokens whole in text[:end] since the last read. `finished`: nothing follows `end` (a number at the
        end is whole)."""
        tokens: list[Token] = []
        position = self.position
        while position < end:
            if self._in_string:
                plain = _PLAIN.match(text, position, end)
                if plain:
                    tokens.append(("chars", plain.group()))
                    position = plain.end()
                    continue
                char = text[position]
                if char == '"':
                    tokens.append(("close", char))
                    self._in_string, position = False, position + 1
                    continue
                if char != "\\":
                    tokens.append(("bad", char))  # a control character (json.loads is strict about them)
                    break
                decoded, length = decode_escape(text, position, end)
                if length == 0:
                    break  # the escape is cut off: the next read finishes it
                if decoded is None:
                    tokens.append(("bad", text[position:position + 2]))
                    break
                tokens.append(("chars", decoded))
                position += length
                continue
            if self._word_start >= 0:
                position = _WORD.match(text, position, end).end()  # type: ignore[union-attr]  # * always matches
                if position == end and not finished:
                    break
                word, self._word_start = text[self._word_start:position], -1
                canonical = scalar_text(word)
                tokens.append(("bad", word) if canonical is None else ("scalar", canonical))
                continue
            char = text[position]
            if char in _JSON_SPACE:
                position += 1
            elif char in "{}[],:":
                tokens.append((char, char))
                position += 1
            elif char == '"':
                tokens.append(("open", char))
                self._in_string, position = True, position + 1
            elif char in _WORD_START:
                self._word_start = position
            else:
                tokens.append(("other", char))
                position += 1
        if self._word_start >= 0 and finished:
            word, self._word_start = text[self._word_start:end], -1
            canonical = scalar_text(word)
            tokens.append(("bad", word) if canonical is None else ("scalar", canonical))
            position = end
        self.position = position
        return tokens
