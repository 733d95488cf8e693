"""CallReader: the tool calls in JSON the model is still writing, each call's arguments as they grow.

A stream sends a call's name as soon as it is whole and then its arguments a fragment at a time (vLLM's deltas).
The fragments are the arguments in the layout json.dumps writes them (", " and ": " separators, strings re-escaped
as json.dumps escapes them, numbers as json.dumps writes the value), so that concatenated they equal the arguments
the finished text parses to (base.arguments_text), whatever whitespace and escapes the model used. Two cases differ,
both outside well-formed single-keyed JSON: a key written twice (json.loads keeps the last value; a stream has sent
both), and a call the finished text does not parse as one (malformed, or cut off by max_tokens), whose start a stream
may already have sent.

Two shapes are read:
  - calls: call objects {"name": ..., "arguments": {...}}, one after another (separators between them) or in a
    JSON array (hermes, llama3_json, mistral's v3 layout, xlam, "required" tool_choice);
  - value: the JSON value is the arguments of a call whose name came before it (deepseek, mistral's v11 layout).
"""

import dataclasses
import json
from typing import Optional, Protocol

from jaxpaged.server.parsers.tool.json_depth import MAX_JSON_DEPTH
from jaxpaged.server.parsers.tool.json_lexer import JsonLexer, Token

_LAYOUT = {"{": "{", "}": "}", "[": "[", "]": "]", ",": ", ", ":": ": ", "open": '"', "close": '"'}


def _encoded(chars: str) -> str:
    """String characters as json.dumps writes them inside quotes."""
    return json.dumps(chars, ensure_ascii=False)[1:-1]


@dataclasses.dataclass
class CallDraft:
    """One call as a stream knows it so far: its name once whole, its arguments' fragments in order."""

    name: Optional[str] = None
    fragments: list[str] = dataclasses.field(default_factory=list)
    """The arguments text so far, in pieces (a stream sends the pieces it has not sent yet)."""
    complete: bool = False
    """The call's JSON has ended: the draft grows no more."""

    @classmethod
    def whole(cls, name: str, arguments: str) -> "CallDraft":
        """A call known whole at once."""
        return cls(name, [arguments], complete=True)


class DraftSource(Protocol):
    """What a scanner reads a block's drafts with (CallReader is one; functiongemma has its own)."""

    drafts: list[CallDraft]

    @property
    def position(self) -> int:
        """Where it has read to in the text."""
        ...

    def read(self, text: str, end: int, finished: bool = False) -> list[CallDraft]:
        """The drafts after reading text[:end]."""
        ...


class CallReader:
    """Reads text[position:] as it grows: call objects (argument_keys name the key that holds the arguments, the
    first present one counts) or, given `name`, one value that is the arguments."""

    def __init__(self, position: int, argument_keys: tuple[str, ...] = ("arguments", "parameters"),
                 separators: str = "", name: Optional[str] = None, single: bool = False) -> None:
        self._lexer = JsonLexer(position)
        self.argument_keys = argument_keys
        self.separators = separators
        """Characters allowed between top-level values besides whitespace (llama3_json's ";")."""
        self.single = single
        """Only one top-level value (a JSON array of calls, or one call object)."""
        self.value_mode = name is not None
        self.drafts: list[CallDraft] = [CallDraft(name)] if name is not None else []
        self.done = False
        """The reader has read all it will (its value ended, or the text is not JSON of this shape any more)."""
        self._stack: list[str] = []  # open containers: "{" or "["
        self._expect_key = False  # the innermost object wants a key next
        self._call_depth = -1  # the stack depth inside the call object being read
        self._key: list[str] = []  # the call object's key being read
        self._last_key = ""  # the key whose value comes next
        self._capture = ""  # "name" or "arguments": what the value being read is, in the call object
        self._capture_depth = -1  # the stack depth the captured value started at
        self._name: list[str] = []
        self._has_arguments = False  # this call's arguments key was seen (a later one is not captured)
        self._string_is_key = False
        self._raw_string = False  # the arguments are a JSON string: its characters are sent as they are

    @property
    def position(self) -> int:
        """Where the reader has read to in the text."""
        return self._lexer.position

    def read(self, text: str, end: int, finished: bool = False) -> list[CallDraft]:
        """The drafts after reading text[:end] (`finished`: nothing follows `end`)."""
        if not self.done:
            for token in self._lexer.read(text, end, finished):
                self._take(token)
                if self.done:
                    break
        return self.drafts

    def _stop(self) -> None:
        self.done = True

    def _take(self, token: Token) -> None:
        kind, value = token
        if kind == "bad" or (kind == "other" and self._stack):
            self._stop()
            return
        if not self._stack and self._capture == "" and not self.value_mode:
            if kind == "other":
                if not (value.isspace() or value in self.separators):
                    self._stop()
                return
            if kind == "{":
                self.drafts.append(CallDraft())
                self._call_depth, self._has_arguments = 1, False
            elif kind != "[":
                self._stop()  # a scalar or string where calls are read: not this shape
                return
        elif self.value_mode and not self._stack and self._capture == "":
            if kind == "other":
                self._stop()
                return
            self._capture, self._capture_depth = "arguments", 0
        elif kind == "{" and len(self._stack) == 1 and self._stack[0] == "[" and not self.value_mode:
            self.drafts.append(CallDraft())
            self._call_depth, self._has_arguments = 2, False
        self._structure(kind, value)

    def _structure(self, kind: str, value: str) -> None:
        depth = len(self._stack)
        in_call_object = depth == self._call_depth and self._capture == ""
        if in_call_object and kind == ":":
            self._start_value()
            return
        if self._capture:
            self._captured(kind, value, depth)
        elif in_call_object and self._string_is_key and kind in ("chars", "close"):
            if kind == "chars":
                self._key.append(value)
            else:
                self._last_key, self._key = "".join(self._key), []
        if kind in ("{", "["):
            if len(self._stack) == MAX_JSON_DEPTH:  # the finished text's parse refuses it too (json_depth.py)
                self._stop()
                return
            self._stack.append(kind)
            self._expect_key = kind == "{"
        elif kind in ("}", "]"):
            if not self._stack or "{[".index(self._stack[-1]) != "}]".index(kind):
                self._stop()
                return
            self._stack.pop()
            self._expect_key = False
            self._close_value(len(self._stack))
        elif kind == "open":
            self._string_is_key = self._expect_key
            self._expect_key = False
        elif kind == "close":
            self._close_value(len(self._stack), string=True)
        elif kind == "scalar":
            self._close_value(len(self._stack))
        elif kind == ",":
            self._expect_key = bool(self._stack) and self._stack[-1] == "{"

    def _start_value(self) -> None:
        """After a key of the call object: what its value is to a stream."""
        if self._last_key == "name":
            self._capture, self._name = "name", []
        elif self._last_key in self.argument_keys and not self._has_arguments:
            self._capture, self._has_arguments = "arguments", True
        else:
            self._capture = "skip"
        self._capture_depth = len(self._stack)

    def _captured(self, kind: str, value: str, depth: int) -> None:
        """A token of a captured value: the name's characters, or the arguments' layout."""
        draft = self.drafts[-1]
        if self._capture == "name":
            if kind == "chars":
                self._name.append(value)
            elif kind not in ("open", "close"):
                self._capture = "skip"  # not a string: the call is malformed (the finished parse says so)
        elif self._capture == "arguments":
            if depth == self._capture_depth and kind == "open":
                self._raw_string = True
            elif self._raw_string and depth == self._capture_depth:
                if kind == "chars":
                    draft.fragments.append(value)
            else:
                draft.fragments.append(_encoded(value) if kind == "chars" else _LAYOUT.get(kind, value))

    def _close_value(self, depth: int, string: bool = False) -> None:
        """A value (or a string) ended at `depth`: the captured value may be whole, the call object may close."""
        if self._capture and depth == self._capture_depth:
            if self._capture == "name" and string:
                self.drafts[-1].name = "".join(self._name)
            self._capture, self._raw_string = "", False
            if self.value_mode:
                self.drafts[-1].complete = True
                self._stop()
            return
        if depth == self._call_depth - 1 and not self._capture:
            self._call_depth = -1
            if not self._has_arguments:
                self.drafts[-1].fragments.append("{}")  # base.named_call's arguments when the key is missing
            self.drafts[-1].complete = True
            if self.single and depth == 0:
                self._stop()
        elif depth == 0 and self.single and not self.value_mode:
            self._stop()
