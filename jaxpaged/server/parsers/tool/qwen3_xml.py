"""qwen3_xml: Qwen3-Coder's XML-style calls, `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...
</function></tool_call>`, each block sent as soon as its end tag arrives (the hermes blocks' streaming).

A parameter's value is text between its tags (one newline on each side is layout, not value). Values that are JSON
(numbers, true/false/null, objects, arrays) become those values; anything else stays a string, as a string
parameter's value would be. The parser sees no schemas (one parser serves every request), so a string parameter whose
text happens to be a number comes back as that number: the one case where vLLM, which reads the schema, differs.
"""

from typing import Any, Optional

from jaxpaged.server.parsers.tool.base import Call, arguments_text
from jaxpaged.server.parsers.tool.hermes import HermesToolParser
from jaxpaged.server.parsers.tool.json_depth import load_json

FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


def parameter_value(text: str) -> Any:
    """A parameter's value from the text between its tags."""
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    stripped = text.strip()
    if stripped and (stripped[0] in "{[-0123456789" or stripped in ("true", "false", "null")):
        try:
            return load_json(stripped)
        except ValueError:
            pass
    return text


def parse_function_block(body: str) -> Optional[Call]:
    """The call of one `<tool_call>` block's body; None when it holds no well-formed function."""
    start = body.find(FUNCTION)
    if start < 0:
        return None
    name_end = body.find(">", start)
    if name_end < 0:
        return None
    name = body[start + len(FUNCTION):name_end].strip()
    end = body.find(FUNCTION_END, name_end)
    inner = body[name_end + 1:end if end >= 0 else len(body)]
    arguments: dict[str, Any] = {}
    position = 0
    while (opened := inner.find(PARAMETER, position)) >= 0:
        key_end = inner.find(">", opened)
        if key_end < 0:
            return None
        closed = inner.find(PARAMETER_END, key_end)
        if closed < 0:
            return None  # a parameter cut off: the call is not whole
        arguments[inner[opened + len(PARAMETER):key_end].strip()] = parameter_value(inner[key_end + 1:closed])
        position = closed + len(PARAMETER_END)
    return (name, arguments_text(arguments)) if name else None


class Qwen3XmlToolParser(HermesToolParser):
    """`<tool_call>` blocks of `<function=...>` with `<parameter=...>` values; text before the first is content. The
    hermes blocks' search and streaming, each block's body read as XML-style parameters."""

    name = "qwen3_xml"
    parse_block = staticmethod(parse_function_block)

    def auto_grammar(self, tools: list[dict]) -> Optional[str]:
        """No grammar of this format here (hermes's is of JSON blocks): "auto" output is parsed unconstrained."""
        return None
