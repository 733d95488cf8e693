"""mistral: `[TOOL_CALLS]` then the calls, as a JSON array `[{"name": ..., "arguments": {...}}]` (Mistral's v3
tokenizers) or as `name[ARGS]{...}` per call (v11 and later)."""

import json
import random
import string
from typing import Optional

from jaxpaged.server.parsers.marker_search import MarkerSearch
from jaxpaged.server.parsers.tool.base import Call, ToolParser, arguments_text, named_call
from jaxpaged.server.parsers.tool.call_reader import CallReader
from jaxpaged.server.parsers.tool.json_depth import raw_decode_json
from jaxpaged.server.parsers.tool.scanner import CallScanner

_ID_ALPHABET = string.ascii_letters + string.digits


START, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralScanner(CallScanner):
    """Drafts each `[TOOL_CALLS]` part as it is written: a JSON array's call objects (v3), or `name[ARGS]` and then
    the arguments (v11). The calls themselves are parsed when the text ends, as parse_section reads them."""

    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser)
        self._parts = MarkerSearch(START)
        self._part_starts: list[int] = []  # where each part's body begins (after its [TOOL_CALLS])
        self._drafting = 0  # the part being read
        self._part_reader: Optional[CallReader] = None
        self._num_drafts_before = 0  # the drafts of the parts before the one being read

    @property
    def num_scanned(self) -> int:
        return super().num_scanned + self._parts.num_scanned

    def _update_drafts(self, text: str, start: int) -> None:
        search_from = self._part_starts[-1] if self._part_starts else start
        while (found := self._parts.find(text, search_from)) >= 0:
            self._part_starts.append(found + len(START))
            search_from = found + len(START)
        while self._drafting < len(self._part_starts):
            index = self._drafting
            last = index + 1 == len(self._part_starts)
            part_end = len(text) if last else self._part_starts[index + 1] - len(START)
            if self._part_reader is None:
                self._part_reader = self._part_reader_at(text, self._part_starts[index], part_end)
                if self._part_reader is None and last:
                    return  # its head is still being written
            if self._part_reader is not None:
                reader, before = self._part_reader, self._part_reader.position
                reader.read(text, part_end, finished=not last)
                self._count(reader.position - before)
                self.drafts.extend(reader.drafts[len(self.drafts) - self._num_drafts_before:])
            if last:
                return
            self._drafting, self._part_reader, self._num_drafts_before = index + 1, None, len(self.drafts)

    def _part_reader_at(self, text: str, body_start: int, part_end: int) -> Optional[CallReader]:
        """A reader of the part whose body starts at body_start, once its head is whole (None: not yet)."""
        position = body_start
        while position < part_end and text[position].isspace():
            position += 1
        if position == part_end:
            return None
        if text[position] == "[" and not text.startswith(ARGS, position) and \
                not (part_end - position < len(ARGS) and ARGS.startswith(text[position:part_end])):
            return CallReader(position, single=True)
        args = text.find(ARGS, position, part_end)
        if args < 0:
            return None
        name = text[position:args].strip()
        return CallReader(args + len(ARGS), name=name) if name else None


class MistralToolParser(ToolParser):
    """Text before `[TOOL_CALLS]` is content. Mistral's chat templates want 9-character alphanumeric call ids."""

    name = "mistral"
    START, ARGS = START, ARGS
    markers = (START,)
    keeps_special_tokens = True
    scanner_class = MistralScanner

    def parse_section(self, section: str) -> Optional[list[Call]]:
        decoder, calls = json.JSONDecoder(), []
        for part in section.split(self.START)[1:]:
            body = part.strip()
            try:
                if body.startswith("["):
                    items, _ = raw_decode_json(decoder, body)
                    found = [named_call(item, "arguments", "parameters") for item in items]
                    if not isinstance(items, list) or not all(found):
                        return None
                    calls.extend(call for call in found if call is not None)
                    continue
                name, args, rest = body.partition(self.ARGS)
                arguments, _ = raw_decode_json(decoder, rest.lstrip())
            except (ValueError, TypeError):
                return None
            if not args or not name.strip():
                return None
            calls.append((name.strip(), arguments_text(arguments)))
        return calls

    def call_id(self) -> str:
        return "".join(random.choices(_ID_ALPHABET, k=9))
