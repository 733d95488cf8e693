"""functiongemma: Google FunctionGemma's calls, `<start_function_call>call:NAME{key:<escape>value<escape>,...}
<end_function_call>`, found as hermes blocks are; a stream sends a call's name, then each argument once its value is
whole (GemmaCallReader).

The arguments are FunctionGemma's own notation, as its chat template writes them: strings between `<escape>` tokens,
numbers and true/false/null bare, objects `{key:value,...}` and lists `[value,...]`. A value between `<escape>` tokens
that is JSON (a number, true, an object...) becomes that value, as vLLM's parser reads it (json.loads first, the text
otherwise); vLLM reads only `<escape>`-wrapped values of a flat object, so bare values and nesting are read here in
addition. A call cut off before its end token counts when its braces close.
"""

import json
import re
from typing import Any, Optional

from jaxpaged.server.parsers.tool.base import Call, arguments_text
from jaxpaged.server.parsers.tool.call_reader import CallDraft, DraftSource
from jaxpaged.server.parsers.tool.hermes import HermesToolParser
from jaxpaged.server.parsers.tool.json_depth import MAX_JSON_DEPTH, load_json

START, END = "<start_function_call>", "<end_function_call>"
ESCAPE = "<escape>"
CALL_PREFIX = "call:"
_NAME = re.compile(r"[\w.\-]+")
_BARE_END = re.compile(r"[,}\]]")
_STRUCTURE = re.compile(r"[{}\[\],<]")  # what the stream's member scan stops at outside <escape> strings


class _Malformed(ValueError):
    """The text is not FunctionGemma's notation."""


def _typed(text: str) -> Any:
    """A value's text: the JSON it spells, else the text itself (vLLM's reading of `<escape>`-wrapped values)."""
    try:
        return load_json(text)
    except ValueError:
        return text


class _ArgumentReader:
    """A recursive-descent reader of FunctionGemma's notation (at most MAX_JSON_DEPTH levels deep)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _skip_space(self, position: int) -> int:
        while position < len(self.text) and self.text[position].isspace():
            position += 1
        return position

    def _expect(self, position: int, token: str) -> int:
        position = self._skip_space(position)
        if not self.text.startswith(token, position):
            raise _Malformed(f"expected {token!r} at {position}")
        return position + len(token)

    def object(self, position: int, depth: int) -> tuple[dict[str, Any], int]:
        """The object whose `{` is at `position` (after spaces), and where it ends."""
        if depth > MAX_JSON_DEPTH:
            raise _Malformed("nested too deep")
        position = self._expect(position, "{")
        result: dict[str, Any] = {}
        if self.text.startswith("}", self._skip_space(position)):
            return result, self._skip_space(position) + 1
        while True:
            colon = self.text.find(":", position)
            if colon < 0:
                raise _Malformed("a key without a value")
            key = self.text[position:colon].strip()
            if not _NAME.fullmatch(key):
                raise _Malformed(f"bad key {key!r}")
            result[key], position = self.value(colon + 1, depth)
            position = self._skip_space(position)
            if self.text.startswith("}", position):
                return result, position + 1
            position = self._expect(position, ",")

    def array(self, position: int, depth: int) -> tuple[list[Any], int]:
        """The list whose `[` is at `position` (after spaces), and where it ends."""
        if depth > MAX_JSON_DEPTH:
            raise _Malformed("nested too deep")
        position = self._expect(position, "[")
        items: list[Any] = []
        if self.text.startswith("]", self._skip_space(position)):
            return items, self._skip_space(position) + 1
        while True:
            item, position = self.value(position, depth)
            items.append(item)
            position = self._skip_space(position)
            if self.text.startswith("]", position):
                return items, position + 1
            position = self._expect(position, ",")

    def value(self, position: int, depth: int) -> tuple[Any, int]:
        """The value at `position` (after spaces) and where it ends."""
        position = self._skip_space(position)
        if self.text.startswith(ESCAPE, position):
            end = self.text.find(ESCAPE, position + len(ESCAPE))
            if end < 0:
                raise _Malformed("an unclosed <escape>")
            return _typed(self.text[position + len(ESCAPE):end]), end + len(ESCAPE)
        if self.text.startswith("{", position):
            return self.object(position, depth + 1)
        if self.text.startswith("[", position):
            return self.array(position, depth + 1)
        bare_end = _BARE_END.search(self.text, position)
        end = bare_end.start() if bare_end else len(self.text)
        bare = self.text[position:end].strip()
        if not bare:
            raise _Malformed(f"no value at {position}")
        return _typed(bare), end


def parse_gemma_call(body: str) -> Optional[Call]:
    """The call of one block's body (`call:NAME{...}`); None when it is malformed."""
    text = body.strip()
    if not text.startswith(CALL_PREFIX):
        return None
    brace = text.find("{")
    name = text[len(CALL_PREFIX):brace].strip() if brace >= 0 else ""
    if not _NAME.fullmatch(name):
        return None
    reader = _ArgumentReader(text)
    try:
        arguments, end = reader.object(brace, 0)
    except _Malformed:
        return None
    if text[end:].strip():
        return None  # text after the arguments' closing brace
    return name, arguments_text(arguments)


class GemmaCallReader:
    """A stream's draft of one call block: its name once `call:NAME{` is whole, then each top-level argument as a
    fragment once its value is whole (a value is typed only whole: `<escape>42<escape>` is 42), laid out as
    json.dumps lays out the arguments object, so the fragments add up to the finished call's arguments."""

    def __init__(self, body_start: int) -> None:
        self.position = body_start
        """Where the scan has read to."""
        self.drafts: list[CallDraft] = []
        self._member_start = -1  # the argument being written (after `{` or a top-level `,`)
        self._depth = 0  # brackets open inside the argument, outside <escape> strings
        self._in_string = False  # between <escape> tokens
        self._done = False
        self._head_from = body_start  # where the head's `{` is looked for

    def read(self, text: str, end: int, finished: bool = False) -> list[CallDraft]:
        """The drafts after reading text[:end]."""
        if not self._done and not self.drafts:
            self._read_head(text, end)
        while not self._done and self.drafts and self.position < end and self._scan(text, end):
            pass
        return self.drafts

    def _read_head(self, text: str, end: int) -> None:
        brace = text.find("{", self._head_from, end)
        if brace < 0:
            self._head_from = end  # the next read looks only at what is new
            return
        head = text[self.position:brace].strip()
        name = head[len(CALL_PREFIX):].strip()
        if not head.startswith(CALL_PREFIX) or not _NAME.fullmatch(name):
            self._done = True
            return
        self.drafts.append(CallDraft(name))
        self.position = self._member_start = brace + 1

    def _scan(self, text: str, end: int) -> bool:
        """Moves past the next structural character (or <escape> token) and acts on it; False when it must wait
        for more text."""
        if self._in_string:
            close = text.find(ESCAPE, self.position, end)
            if close < 0:
                self.position = max(self.position, end - len(ESCAPE) + 1)  # the closing token may be cut off
                return False
            self._in_string, self.position = False, close + len(ESCAPE)
            return True
        found = _STRUCTURE.search(text, self.position, end)
        if found is None:
            self.position = end
            return False
        char, at = found.group(), found.start()
        if char == "<":
            if text.startswith(ESCAPE, at):
                self._in_string, self.position = True, at + len(ESCAPE)
                return True
            if end - at < len(ESCAPE) and ESCAPE.startswith(text[at:end]):
                self.position = at  # a cut-off <escape>: wait for the rest
                return False
            self.position = at + 1
            return True
        self.position = at + 1
        if char in "{[":
            self._depth += 1
        elif self._depth > 0 and char in "}]":
            self._depth -= 1
        elif self._depth == 0 and char in ",}":
            self._member(text, at, closes=char == "}")
        return True

    def _member(self, text: str, end: int, closes: bool) -> None:
        """An argument ended at text[end] (a top-level `,` or the closing `}`): its fragment goes out."""
        draft, member = self.drafts[0], text[self._member_start:end]
        if not member.strip() and closes and not draft.fragments:
            draft.fragments.append("{}")
        else:
            colon = member.find(":")
            key = member[:colon].strip() if colon >= 0 else ""
            try:
                if not _NAME.fullmatch(key):
                    raise _Malformed(f"bad key {key!r}")
                reader = _ArgumentReader(member)
                value, value_end = reader.value(colon + 1, 0)
                if member[value_end:].strip():
                    raise _Malformed("text after a value")
            except _Malformed:
                self._done = True  # the finished parse leaves the call out
                return
            separator = ", " if draft.fragments else "{"
            draft.fragments.append(f"{separator}{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
            if closes:
                draft.fragments.append("}")
        self._member_start = end + 1
        if closes:
            draft.complete, self._done = True, True


class FunctionGemmaToolParser(HermesToolParser):
    """`<start_function_call>` blocks of `call:NAME{...}`; text before the first is content. The markers are special
    tokens of FunctionGemma's tokenizer, so requests keep them in the text."""

    name = "functiongemma"
    markers = (START,)
    block_end = END
    keeps_special_tokens = True
    parse_block = staticmethod(parse_gemma_call)

    def block_reader(self, body_start: int) -> Optional[DraftSource]:
        return GemmaCallReader(body_start)

    def auto_grammar(self, tools: list[dict]) -> Optional[str]:
        """No grammar of this notation here: "auto" output is parsed unconstrained, as vLLM does."""
        return None
