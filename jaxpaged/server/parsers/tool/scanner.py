"""CallScanner: one stream's place in a growing model text, for its tool parser.

A stream hands the parser the sample's whole text at every step, and the text only grows. Re-reading it from the
start each time made a stream's work quadratic (issue 56: 27.8 ms a chunk at 128k characters, on the event loop). A
scanner keeps where it got to instead: where the call section starts, where a marker could still begin, the calls
already complete. Each step looks at the new characters (plus the few a marker split across steps needs), so a
whole stream costs time linear in its text. The finished text is parsed the same way as parser.calls() reads it.

`num_scanned` counts the characters the scanner looked at (searched, or handed to a JSON decoder), so tests can
check that the work is linear without timing it.
"""

import re
from typing import ClassVar, Optional, Protocol

from jaxpaged.server.parsers.marker_search import MarkerSearch
from jaxpaged.server.parsers.tool.call_reader import CallDraft, CallReader

Call = tuple[str, str]
"""(function name, arguments as JSON text)."""


class CallFormat(Protocol):
    """What a scanner reads of its parser (base.ToolParser is one): the format's markers, its opener, its section
    parse. A protocol rather than an import of base.py, which imports this module."""

    markers: ClassVar[tuple[str, ...]]
    """Strings that open the call section."""
    opener: ClassVar[Optional[str]]
    """When set, an answer that begins with it is a call section too."""

    def parse_section(self, section: str) -> Optional[list[Call]]:
        """The calls of a whole call section, or None if it does not parse."""
        ...

    def section_reader(self, text: str, start: int) -> Optional[CallReader]:
        """A reader of the calls' JSON in the section that starts at text[start] (None: the calls go whole)."""
        ...

_NON_SPACE = re.compile(r"\S")  # \s is str.isspace's whitespace, as str.strip() uses


class CallScanner:
    """A parser's view of one streamed text: content up to the call section, calls as they complete.

    The base class finds the section (a marker, or for formats with an `opener` an answer that begins with it);
    formats whose section parses only as a whole (llama3_json, pythonic, mistral) send their calls at the end.
    Hermes and DeepSeek subclass it to send each call as soon as its end marker arrives.
    """

    def __init__(self, parser: CallFormat) -> None:
        self.parser = parser
        self._markers = [MarkerSearch(marker) for marker in parser.markers]
        self._base: Optional[int] = None  # where the parser's text begins in the sample's text
        self._marker_start = -1  # the first marker, once found
        self._lead = -1  # the first non-space character (formats with an opener), once found
        self._lead_resume = 0
        self.calls: list[Call] = []
        """The calls complete so far (only ever appended to while the text grows)."""
        self.drafts: list[CallDraft] = []
        """The calls as a stream may send them so far: names once whole, arguments as they are written (only ever
        appended to, and each draft only grows)."""
        self._reader: Optional[CallReader] = None
        self._num_scanned_here = 0

    @property
    def num_scanned(self) -> int:
        """Characters of the text looked at so far (each search's span, each JSON decoder's input)."""
        return self._num_scanned_here + sum(search.num_scanned for search in self._markers)

    def advance(self, text: str, base: int = 0, finished: bool = False) -> tuple[int, list[Call]]:
        """For the parser's text text[base:] so far (`base` stays the same for a stream; the text only grows):
        (where the sure content ends, as an index into `text`; the calls known so far). Finished: the final calls,
        and the content runs to the section when there are calls, else to the end (all of it is content)."""
        if self._base is None:
            self._base = self._lead_resume = base
        self._find_section(text)
        start = self.section_start(text)
        if finished:
            calls = self._final_calls(text, start) if start >= 0 else []
            return (start if calls else len(text)), calls
        calls = self._stream_calls(text, start) if start >= 0 else []
        if start >= 0:
            self._update_drafts(text, start)
        return self._content_end(text, start), calls

    def section_start(self, text: str) -> int:
        """Where the call section starts so far (-1: not yet): at the first marker, or, for a format with an
        opener, where an answer whose first non-space character is the opener begins."""
        if self._marker_start >= 0:
            return self._marker_start
        opener = self.parser.opener
        if opener is not None and self._lead >= 0 and text.startswith(opener, self._lead):
            return self._lead
        return -1

    def _find_section(self, text: str) -> None:
        assert self._base is not None
        if self._marker_start < 0:
            found = [position for position in (search.find(text, self._base) for search in self._markers)
                     if position >= 0]
            self._marker_start = min(found, default=-1)
        if self.parser.opener is not None and self._lead < 0:
            lead = _NON_SPACE.search(text, self._lead_resume)
            self._num_scanned_here += (lead.start() + 1 if lead else len(text)) - self._lead_resume
            self._lead, self._lead_resume = (lead.start(), lead.start()) if lead else (-1, len(text))

    def _content_end(self, text: str, start: int) -> int:
        assert self._base is not None
        if self.parser.opener is not None and self._lead < 0:
            return self._base  # nothing but whitespace yet: the opener may still come
        if start >= 0:
            return start
        return min((search.resume for search in self._markers), default=len(text))  # a cut-off marker waits

    def _stream_calls(self, text: str, start: int) -> list[Call]:
        """The calls complete in a text that may still grow (by default none: the section parses only whole)."""
        return self.calls

    def _update_drafts(self, text: str, start: int) -> None:
        """Brings `drafts` up to the text (by default the parser's section reader reads the whole section; with
        none, the calls go whole when the text ends)."""
        if self._reader is None:
            self._reader = self.parser.section_reader(text, start)
            if self._reader is None:
                return
        before = self._reader.position
        self.drafts = self._reader.read(text, len(text))
        self._num_scanned_here += self._reader.position - before

    def _final_calls(self, text: str, start: int) -> list[Call]:
        """The calls of the finished text, whose section starts at `start`."""
        self._num_scanned_here += len(text) - start
        self.calls = self.parser.parse_section(text[start:]) or []
        return self.calls

    def _count(self, num_chars: int) -> None:
        """Adds characters a subclass looked at (a call body handed to the JSON decoder)."""
        self._num_scanned_here += num_chars
