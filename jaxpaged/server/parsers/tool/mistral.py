"""mistral: `[TOOL_CALLS]` then the calls, as a JSON array `[{"name": ..., "arguments": {...}}]` (Mistral's v3
tokenizers) or as `name[ARGS]{...}` per call (v11 and later)."""

import json
import random
import string
from typing import Optional

from jaxpaged.server.parsers.tool.base import Call, ToolParser, arguments_text, named_call
from jaxpaged.server.parsers.tool.json_depth import raw_decode_json

_ID_ALPHABET = string.ascii_letters + string.digits


class MistralToolParser(ToolParser):
    """Text before `[TOOL_CALLS]` is content. Mistral's chat templates want 9-character alphanumeric call ids."""

    name = "mistral"
    START, ARGS = "[TOOL_CALLS]", "[ARGS]"
    markers = (START,)
    keeps_special_tokens = True

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
