"""deepseek_v3 / deepseek_v31: DeepSeek's tool-call tokens.

  V3 (and R1-0528):  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
                     ```json
                     {...}
                     ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
  V3.1:              <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
Both layouts are read by either name.
"""

import json
from typing import Optional

from jaxpaged.server.parsers.tool.base import Call, ToolParser, arguments_text

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE = "```"


class DeepSeekToolParser(ToolParser):
    """Text before `<｜tool▁calls▁begin｜>` is content."""

    name = "deepseek_v3"
    markers = (CALLS_BEGIN,)
    keeps_special_tokens = True

    def parse_section(self, section: str) -> Optional[list[Call]]:
        calls = []
        for part in section.split(CALL_BEGIN)[1:]:
            body = part.split(CALL_END, 1)[0]
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
                arguments = json.loads(tail)
            except ValueError:
                return None
            if not name.strip():
                return None
            calls.append((name.strip(), arguments_text(arguments)))
        return calls

    def stream_calls(self, text: str) -> list[Call]:
        # Calls are read alike in a prefix that ends after a call's end token and in the whole text.
        end = text.rfind(CALL_END)
        return self.calls(text[:end + len(CALL_END)]) if end >= 0 else []
