"""Tool calls on /v1/chat/completions: tool_choice "required" or a named function constrains the output (a grammar
from the functions' JSON schemas) and returns it as OpenAI tool_calls; "none" answers in text (the tools stay in the
prompt, as vLLM keeps them, unless the server runs with --exclude-tools-when-tool-choice-none).

  - a named function: the output is that function's arguments object, so they can stream as they are sampled;
  - "required": the output is a JSON array of {"name": ..., "parameters": {...}} (one item per call, any of the
    tools, vLLM's layout), parsed into tool_calls when it is complete;
  - "auto": the model decides; the server's --tool-call-parser (tool_parsers.py) splits its text into content
    and tool_calls. Without a parser, "auto" with tools is refused (400). Where the parser has a grammar of its
    format (hermes, llama3_json), the output is constrained to text or well-formed calls of the declared tools,
    unless the request sets its own structured output.
"""

import dataclasses
import json
import uuid
from typing import Optional

from jaxpaged.sampling.grammar.limits import check_schema_depth, check_schema_limits
from jaxpaged.sampling.params import StructuredOutputsParams
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.protocol import ChatCompletionRequest, NamedToolChoice
from jaxpaged.server.parsers.tool import TOOL_CALL_PARSERS, ToolParser
from jaxpaged.server.parsers.tool.json_depth import load_json

AUTO_TOOLS_ORIGIN = "tools"
"""The field a tool_choice "auto" grammar's errors name (a tool's parameters that no grammar can hold)."""
MAX_SHOWN_NAMES = 10
"""Most tool names an error message lists."""
MAX_SHOWN_NAME_CHARS = 32
"""Longer tool names are cut to this many characters in an error message."""


def shown_names(names: list[str]) -> str:
    """The request's tool names as an error message lists them: the first few, each cut short, and how many more.

    The names are the client's own input; echoed whole, thousands of long names would make an error body as large
    as the request.
    """
    shown = [repr(name if len(name) <= MAX_SHOWN_NAME_CHARS else name[:MAX_SHOWN_NAME_CHARS] + "...")
             for name in names[:MAX_SHOWN_NAMES]]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


@dataclasses.dataclass
class ToolCalling:
    """How one chat request calls tools."""

    tools: list[dict]
    """The request's tools as the chat template takes them ({"type": "function", "function": {...}})."""
    forced_name: Optional[str]
    """tool_choice named this function: the whole output is its arguments."""
    parser: Optional[ToolParser] = None
    """tool_choice "auto": the parser of the model's own syntax (no grammar; the model may answer in text)."""
    max_calls: Optional[int] = None
    """1 when the request sets parallel_tool_calls false: later calls are dropped (and "required" grammars hold
    one call); None: any number."""

    def constraint(self) -> Optional[StructuredOutputsParams]:
        """The grammar the output must follow (None for "auto")."""
        if self.parser is not None:
            return None
        if self.forced_name is not None:
            function = next(t["function"] for t in self.tools if t["function"]["name"] == self.forced_name)
            return StructuredOutputsParams(json=function.get("parameters") or {"type": "object"},
                                           origin="tools.function.parameters")
        calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                   "parameters": t["function"].get("parameters") or
                                                   {"type": "object"}},
                  "required": ["name", "parameters"], "additionalProperties": False} for t in self.tools]
        array: dict = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if self.max_calls is not None:
            array["maxItems"] = self.max_calls
        return StructuredOutputsParams(json=array, origin="tools.function.parameters")

    def auto_constraint(self) -> Optional[StructuredOutputsParams]:
        """tool_choice "auto": the parser's grammar of text or calls (None where its format has none here)."""
        if self.parser is None:
            return None
        try:  # before the schemas are written into the grammar (json.dumps recurses)
            check_schema_depth(self.tools)
            for tool in self.tools:  # each tool's own $refs and sizes (its schema is the root they resolve in)
                check_schema_limits(tool["function"].get("parameters") or {})
        except ValueError as error:
            raise APIError(400, f"{AUTO_TOOLS_ORIGIN}: {error}", param=AUTO_TOOLS_ORIGIN, code="invalid_value") \
                from None
        grammar = self.parser.auto_grammar(self.tools)
        return None if grammar is None else StructuredOutputsParams(grammar=grammar, origin=AUTO_TOOLS_ORIGIN)

    @property
    def streams_arguments(self) -> bool:
        """A named function's arguments stream as they are sampled; "required" calls come whole at the end."""
        return self.forced_name is not None

    def limited(self, calls: list) -> list:
        """The calls a choice may return: the first max_calls of them."""
        return calls if self.max_calls is None else calls[:self.max_calls]

    def calls(self, text: str) -> list[dict]:
        """The OpenAI tool_calls of a finished output (arguments as JSON text)."""
        return self.limited(self._all_calls(text))

    def _all_calls(self, text: str) -> list[dict]:
        if self.forced_name is not None:
            return [self.call(self.forced_name, text)]
        if self.parser is not None:
            return [self.call(name, arguments) for name, arguments in self.parser.calls(text)]
        try:
            items = load_json(text)
        except ValueError:  # cut off by max_tokens before the grammar closed the array (or nested too deep)
            return []
        return [self.call(item["name"], json.dumps(item["parameters"], ensure_ascii=False)) for item in items]

    def call(self, name: str, arguments: str) -> dict:
        """One OpenAI tool call, with a new id (in the layout the parser's chat templates expect)."""
        call_id = self.parser.call_id() if self.parser is not None else f"call_{uuid.uuid4().hex[:24]}"
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_calling(request: ChatCompletionRequest, parser: Optional[ToolParser] = None) -> Optional[ToolCalling]:
    """The request's tool calling, or None when its output is plain text (no tools, or tool_choice "none");
    400 for what cannot work. `parser`: the server's --tool-call-parser, which "auto" needs."""
    if not request.tools:
        if request.tool_choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice: needs tools", param="tool_choice", code="invalid_value")
        return None
    choice = request.tool_choice or "auto"
    if choice == "none":
        return None
    max_calls = None if request.parallel_tool_calls is not False else 1
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools]
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: function names must be unique", param="tools", code="invalid_value")
    if choice == "auto":
        if parser is None:
            raise APIError(400, f'tool_choice: "auto" needs the server started with --enable-auto-tool-choice '
                           f'--tool-call-parser NAME ({", ".join(TOOL_CALL_PARSERS)}); or use "required" or name '
                           f'the function', param="tool_choice", code="invalid_value")
        return ToolCalling(tools, None, parser, max_calls)
    if request.response_format is not None and request.response_format.type != "text":
        raise APIError(400, "response_format: cannot be combined with a tool_choice that calls tools",
                       param="response_format", code="invalid_value")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(400, f"tool_choice: names no function in tools (have {shown_names(names)})",
                           param="tool_choice", code="invalid_value")
        return ToolCalling(tools, choice.function.name)
    return ToolCalling(tools, None, max_calls=max_calls)


def prompt_tools(request: ChatCompletionRequest, calling: Optional[ToolCalling],
                 exclude_when_none: bool = False) -> Optional[list[dict]]:
    """The tools the chat template shows the model: the request's, also under tool_choice "none" (vLLM keeps them
    there, so the model knows of them while it answers in text) unless `exclude_when_none`
    (--exclude-tools-when-tool-choice-none)."""
    if calling is not None:
        return calling.tools
    if not request.tools or request.tool_choice != "none" or exclude_when_none:
        return None
    return [tool.model_dump(exclude_none=True) for tool in request.tools]
