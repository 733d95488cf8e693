"""hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, as Hermes, Qwen 2.5 / Qwen 3 and their
chat templates write them."""

import json
from typing import Optional

from jaxpaged.server.parsers.marker_search import MarkerSearch
from jaxpaged.server.parsers.tool.base import Call, ToolParser, named_call, tool_call_schema
from jaxpaged.server.parsers.tool.call_reader import CallDraft, CallReader, DraftSource
from jaxpaged.server.parsers.tool.json_depth import load_json
from jaxpaged.server.parsers.tool.scanner import CallScanner

START, END = "<tool_call>", "</tool_call>"


def parse_block(body: str) -> Optional[Call]:
    """The call of one block's JSON; None when it is malformed (or nested too deep)."""
    try:
        return named_call(load_json(body), "arguments", "parameters")
    except ValueError:
        return None


class HermesScanner(CallScanner):
    """Knows each block's call once its end tag arrives: blocks already read are never read again. For JSON blocks
    (hermes) a stream's drafts follow the block being written, its arguments as they grow; other blocks (qwen3_xml)
    are drafted whole once complete."""

    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser)
        self._next = -1  # where the next block's start tag is looked for (past the blocks read)
        self._open = -1  # the start tag of the block being written, once found
        self._start_tag, self._end_tag = parser.markers[0], getattr(parser, "block_end", END)
        self._starts, self._ends = MarkerSearch(self._start_tag), MarkerSearch(self._end_tag)
        self._block_reader: Optional[DraftSource] = None  # the block being written, read as it grows
        self._drafts_blocks = True  # the parser drafts blocks as they grow (else whole, once complete)

    @property
    def num_scanned(self) -> int:
        return super().num_scanned + self._starts.num_scanned + self._ends.num_scanned

    def _stream_calls(self, text: str, start: int) -> list[Call]:
        if self._next < 0:
            self._next = start  # the section starts at the first block
        while True:
            if self._open < 0:
                self._open = self._starts.find(text, self._next)
                if self._open < 0:
                    return self.calls
            body_start = self._open + len(self._start_tag)
            end = self._ends.find(text, body_start)
            if end < 0:
                return self.calls
            self._read_block(text, body_start, end)
            self._next, self._open = end + len(self._end_tag), -1

    def _update_drafts(self, text: str, start: int) -> None:
        if self._open >= 0 and self._drafts_blocks:
            self._draft_block(text, self._open + len(self._start_tag), len(text), finished=False)

    def _draft_block(self, text: str, body_start: int, body_end: int, finished: bool) -> bool:
        """Reads the block whose body starts at body_start into the drafts (as far as body_end); False when the
        parser drafts its blocks only whole."""
        if self._block_reader is None:
            self._block_reader = getattr(self.parser, "block_reader", lambda _: None)(body_start)
            if self._block_reader is None:
                self._drafts_blocks = False
                return False
        reader, before = self._block_reader, self._block_reader.position
        had_draft = bool(reader.drafts)
        reader.read(text, body_end, finished)
        self._count(reader.position - before)
        if reader.drafts and not had_draft:
            self.drafts.append(reader.drafts[0])
        if finished:
            self._block_reader = None
        return True

    def _final_calls(self, text: str, start: int) -> list[Call]:
        self._stream_calls(text, start)
        if self._open >= 0:  # a block cut off before its end tag still counts when its JSON is whole
            self._read_block(text, self._open + len(self._start_tag), len(text))
            self._next, self._open = len(text), -1
        return self.calls

    def _read_block(self, text: str, body_start: int, body_end: int) -> None:
        self._count(body_end - body_start)
        call = getattr(self.parser, "parse_block", parse_block)(text[body_start:body_end])
        if not self._draft_block(text, body_start, body_end, finished=True) and call is not None:
            self.drafts.append(CallDraft.whole(*call))
        if call is not None:  # a malformed block is left out
            self.calls.append(call)


class HermesToolParser(ToolParser):
    """`<tool_call>` JSON blocks; text before the first block is content. A block cut off before its end tag still
    counts when its JSON is whole; a malformed block is left out."""

    name = "hermes"
    markers = (START,)
    block_end = END
    """The tag that closes a block (the start tag is the marker)."""
    scanner_class = HermesScanner
    parse_block = staticmethod(parse_block)
    """One block's call (None when malformed): a format with other block bodies (qwen3_xml) replaces it."""

    def block_reader(self, body_start: int) -> Optional[DraftSource]:
        """A stream's reader of the block whose body starts at body_start (None: blocks are drafted whole once
        complete, as qwen3_xml's are)."""
        return CallReader(body_start, single=True) if self.parse_block is parse_block else None

    def parse_section(self, section: str) -> Optional[list[Call]]:
        calls, position, start_tag, end_tag = [], 0, self.markers[0], self.block_end
        while (start := section.find(start_tag, position)) >= 0:
            body_start = start + len(start_tag)
            end = section.find(end_tag, body_start)
            body = section[body_start:] if end < 0 else section[body_start:end]
            position = len(section) if end < 0 else end + len(end_tag)
            call = self.parse_block(body)
            if call is not None:
                calls.append(call)
        return calls

    def auto_grammar(self, tools: list[dict]) -> Optional[str]:
        # Text that never writes the start tag, or text (reasoning, a preamble) up to the first start tag and then
        # only well-formed blocks, as Qwen's templates lay them out. NOTE: `before` is lazy (it ends at the first
        # start tag); a greedy text lexeme would never hand over to the block, llguidance's lexer being
        # deterministic.
        call = json.dumps(tool_call_schema(tools, "arguments"))
        return "\n".join([
            "start: TEXT | before blocks",
            f"TEXT: /(?s:.+)/ & ~/(?s:.*{START}.*)/",
            f'before[stop="{START}"]: /(?s:.*)/',
            f'blocks: "\\n" call "\\n{END}" ("\\n{START}\\n" call "\\n{END}")*',
            f"call: %json {call}"])
