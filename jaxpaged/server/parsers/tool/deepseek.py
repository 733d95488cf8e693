"""deepseek_v3 / deepseek_v31: DeepSeek's tool-call tokens.

  V3 (and R1-0528):  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
                     ```json
                     {...}
                     ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
  V3.1:              <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
Both layouts are read by either name.
"""

from typing import Optional

from jaxpaged.server.parsers.marker_search import MarkerSearch
from jaxpaged.server.parsers.tool.base import Call, ToolParser, arguments_text
from jaxpaged.server.parsers.tool.call_reader import CallReader
from jaxpaged.server.parsers.tool.json_depth import load_json
from jaxpaged.server.parsers.tool.scanner import CallScanner

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE = "```"


def parse_call(body: str) -> Optional[Call]:
    """The call of one part (the text after a call's begin token, up to its end token); None when malformed."""
    head, sep, tail = body.partition(SEP)
    if not sep:
        return None
    if head.strip() == "function":  # V3: the name on the first line, the JSON in a fence
        name, _, fenced = tail.partition("\n")
        tail = fenced.strip()
        if tail.startswith(_FENCE):
            tail = tail[tail.find("\n") + 1:] if "\n" in tail else ""
            tail = tail[:tail.rfind(_FENCE)] if _FENCE in tail else tail
    else:
        name = head
    try:
        arguments = load_json(tail)
    except ValueError:
        return None
    if not name.strip():
        return None
    return name.strip(), arguments_text(arguments)


class DeepSeekScanner(CallScanner):
    """Sends calls as their end tokens arrive. The section is cut into parts at each call's begin token; a part
    is known once an end token follows its begin, and it is read once. As in parse_section, one malformed part
    makes the whole section text: no call after it is sent, and the finished text has none."""

    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser)
        self._begins: list[int] = []  # each call's begin token, in the section
        self._ends: list[int] = []  # each call's end token, in the section
        self._call_search = MarkerSearch(CALL_BEGIN, CALL_END)  # one pass finds both
        self._next_token = -1  # where the next token is looked for (past those found)
        self._next_end = 0  # the first of _ends not in front of the next part to read
        self._malformed = False
        self._drafting = 0  # the part whose draft is being written
        self._draft_reader: Optional[CallReader] = None  # its arguments' JSON, once its name is known
        self._header_from = -1  # where its header's next token (separator, newline) is looked for
        self._header_sep = -1  # its separator, once found

    @property
    def num_scanned(self) -> int:
        return super().num_scanned + self._call_search.num_scanned

    def _stream_calls(self, text: str, start: int) -> list[Call]:
        self._find_tokens(text, start)
        last_end = self._ends[-1] if self._ends else -1
        while not self._malformed and len(self.calls) < len(self._begins) \
                and self._begins[len(self.calls)] < last_end:
            self._read_part(text, len(self.calls))
        return [] if self._malformed else self.calls

    def _update_drafts(self, text: str, start: int) -> None:
        """Drafts each part once its name is whole (after the separator; V3: after the name's line and the
        fence's), its arguments read as they are written."""
        while not self._malformed and self._drafting < len(self._begins):
            index = self._drafting
            last = index + 1 == len(self._begins)
            part_end = len(text) if last else self._begins[index + 1]
            if self._draft_reader is None:
                self._draft_reader = self._draft_header(text, index, part_end)
                if self._draft_reader is None:
                    if last:
                        return  # the header is still being written
                    self._drafting, self._header_from, self._header_sep = index + 1, -1, -1
                    continue  # a part without a well-formed header (parse_call says so at the end)
                self.drafts.append(self._draft_reader.drafts[0])
            reader, before = self._draft_reader, self._draft_reader.position
            reader.read(text, part_end, finished=not last)
            self._count(reader.position - before)
            if last:
                return
            self._drafting, self._draft_reader, self._header_from, self._header_sep = index + 1, None, -1, -1

    def _draft_header(self, text: str, index: int, part_end: int) -> Optional[CallReader]:
        """A reader of part `index`'s arguments once its header is whole (None: not yet, or never). Each step
        looks only past what the last one read (_header_from), so a header costs its length."""
        body_start = self._begins[index] + len(CALL_BEGIN)
        if self._header_sep < 0:
            sep = text.find(SEP, max(body_start, self._header_from), part_end)
            resume = max(body_start, part_end - len(SEP) + 1) if sep < 0 else sep + len(SEP)
            self._count(max(0, resume - max(body_start, self._header_from)))
            self._header_from = resume
            if sep < 0:
                return None
            self._header_sep = sep
        after_sep = self._header_sep + len(SEP)
        if text[body_start:self._header_sep].strip() != "function":  # V3.1: the arguments follow the separator
            name = text[body_start:self._header_sep].strip()
            return CallReader(after_sep, name=name) if name else None
        line_end = text.find("\n", self._header_from, part_end)  # V3: the name's line, then a fence's line
        if line_end < 0:
            self._count(part_end - self._header_from)
            self._header_from = part_end
            return None
        name = text[after_sep:line_end].strip()
        json_start = line_end + 1
        while json_start < part_end and text[json_start].isspace():
            json_start += 1
        if json_start == part_end or (text[json_start] == "`" and part_end - json_start < len(_FENCE)):
            return None
        if text.startswith(_FENCE, json_start):
            fence_end = text.find("\n", json_start, part_end)
            if fence_end < 0:
                return None
            json_start = fence_end + 1
        self._count(json_start - self._header_from)
        return CallReader(json_start, name=name) if name else None

    def _final_calls(self, text: str, start: int) -> list[Call]:
        self._stream_calls(text, start)
        while not self._malformed and len(self.calls) < len(self._begins):
            self._read_part(text, len(self.calls))
        return [] if self._malformed else self.calls

    def _find_tokens(self, text: str, start: int) -> None:
        """Every call's begin and end token written since the last step."""
        search = self._call_search
        if self._next_token < 0:
            self._next_token = start
        while (position := search.find(text, self._next_token)) >= 0:
            (self._begins if search.found == CALL_BEGIN else self._ends).append(position)
            self._next_token = position + len(search.found)

    def _read_part(self, text: str, index: int) -> None:
        """Reads part `index`: from its begin token to the first end token in it, or to where it ends."""
        body_start = self._begins[index] + len(CALL_BEGIN)
        part_end = self._begins[index + 1] if index + 1 < len(self._begins) else len(text)
        while self._next_end < len(self._ends) and self._ends[self._next_end] < body_start:
            self._next_end += 1
        body_end = part_end
        if self._next_end < len(self._ends) and self._ends[self._next_end] < part_end:
            body_end = self._ends[self._next_end]
        self._count(body_end - body_start)
        call = parse_call(text[body_start:body_end])
        if call is None:
            self._malformed = True
        else:
            self.calls.append(call)


class DeepSeekToolParser(ToolParser):
    """Text before `<｜tool▁calls▁begin｜>` is content."""

    name = "deepseek_v3"
    markers = (CALLS_BEGIN,)
    keeps_special_tokens = True
    scanner_class = DeepSeekScanner

    def parse_section(self, section: str) -> Optional[list[Call]]:
        calls = []
        for part in section.split(CALL_BEGIN)[1:]:
            call = parse_call(part.split(CALL_END, 1)[0])
            if call is None:
                return None
            calls.append(call)
        return calls
