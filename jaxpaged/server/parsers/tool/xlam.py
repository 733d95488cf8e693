"""xlam: Salesforce xLAM's calls, a JSON array `[{"name": ..., "arguments": {...}}]` as the whole answer, or after
text inside a ```json fence, after `[TOOL_CALLS]`, or in `<tool_call>` tags (the layouts vLLM's xlam parser reads)."""

from typing import Optional

from jaxpaged.server.parsers.tool.base import Call, ToolParser, decode_json_objects, named_call
from jaxpaged.server.parsers.tool.call_reader import CallReader

FENCE, FENCE_END = "```json", "```"
TOOL_CALLS = "[TOOL_CALLS]"
TAG, TAG_END = "<tool_call>", "</tool_call>"


def _body(section: str) -> str:
    """The JSON of a call section, its marker (and a closing fence or tag) taken off."""
    for opening, closing in ((FENCE, FENCE_END), (TAG, TAG_END), (TOOL_CALLS, None)):
        if section.startswith(opening):
            body = section[len(opening):]
            if closing is not None and (end := body.rfind(closing)) >= 0:
                body = body[:end]
            return body
    return section


class XlamToolParser(ToolParser):
    """An answer that is a JSON array (or object) of calls, or text followed by one of the markers and the calls;
    a stream sends each call's arguments as they are written."""

    name = "xlam"
    markers = (FENCE, TOOL_CALLS, TAG)
    opener = "["

    def section_reader(self, text: str, start: int) -> Optional[CallReader]:
        marker = next((marker for marker in (FENCE, TAG, TOOL_CALLS) if text.startswith(marker, start)), "")
        return CallReader(start + len(marker))

    def parse_section(self, section: str) -> Optional[list[Call]]:
        values = decode_json_objects(_body(section))
        if not values:
            return None
        items = [item for value in values for item in (value if isinstance(value, list) else [value])]
        calls = [named_call(item, "arguments", "parameters") for item in items]
        return [call for call in calls if call is not None] if items and all(calls) else None
