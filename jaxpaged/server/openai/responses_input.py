"""POST /v1/responses, the request side: OpenAI's Responses API request, read into the chat completion it runs as.

The endpoint is stateless (vLLM's without `store`): `input` carries the whole conversation, as a string or as items
(messages, the model's earlier function calls and their outputs); `instructions` becomes the system message;
function tools come flat ({"type": "function", "name": ...}) and go to the chat template in the chat layout. Every
error names the Responses field the client sent (`input[2].call_id`), not the chat field it became.
"""

from typing import Any, Literal, Optional, Union

from pydantic import Field

from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.protocol import StrictModel

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PART_TYPES = ("input_text", "output_text", "text")
_HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
                 "image_generation", "mcp", "local_shell", "shell", "apply_patch", "custom")
_PASSED_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                         "frequency_penalty", "repetition_penalty", "logit_bias", "cache_salt", "priority",
                         "request_id", "ignore_eos", "min_tokens", "chat_template_kwargs", "skip_special_tokens",
                         "include_reasoning")
"""Keys that keep their chat meaning (OpenAI's and vLLM's sampling extras)."""


class ResponsesRequest(StrictModel):
    """POST /v1/responses: the fields this server reads; the rest of the body passes to the chat request as is."""

    model: Optional[str] = None
    input: Union[str, list[Any]]
    """A user message as text, or the conversation's items."""
    instructions: Optional[str] = None
    """The system (developer) message, put first."""
    max_output_tokens: Optional[int] = Field(None, ge=1)
    tools: Optional[list[Any]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict, None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[dict] = None
    """{"format": {"type": "text" | "json_object" | "json_schema", ...}}."""
    reasoning: Optional[dict] = None
    """{"effort": "low" | "medium" | "high", ...}: the effort reaches the chat template."""
    stream: bool = False
    store: Optional[bool] = None
    """Stored responses are not kept (the endpoint is stateless); accepted so clients that send true still work."""
    previous_response_id: Optional[str] = None
    metadata: Optional[dict] = None
    user: Optional[str] = None
    truncation: Optional[Literal["auto", "disabled"]] = None


def chat_payload(request: ResponsesRequest, body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request that `request` (its raw body: `body`) runs as; 400 naming the Responses field for
    what a stateless server cannot do or what is malformed."""
    if request.previous_response_id is not None:
        raise APIError(400, "previous_response_id: this server keeps no responses (stateless); send the whole "
                       "conversation in `input`", param="previous_response_id", code="invalid_value")
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    messages += input_messages(request.input)
    if not messages:
        raise APIError(400, "input: needs at least one item", param="input", code="invalid_value")
    payload: dict[str, Any] = {key: body[key] for key in _PASSED_SAMPLING_KEYS if key in body}
    payload |= {"model": request.model, "messages": messages, "stream": request.stream}
    if request.max_output_tokens is not None:
        payload["max_completion_tokens"] = request.max_output_tokens
    if request.tools:
        payload["tools"] = [_chat_tool(tool, index) for index, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        payload["tool_choice"] = _chat_tool_choice(request.tool_choice)
    if request.parallel_tool_calls is not None:
        payload["parallel_tool_calls"] = request.parallel_tool_calls
    if request.text is not None and request.text.get("format") is not None:
        payload["response_format"] = _response_format(request.text["format"])
    if request.reasoning is not None and request.reasoning.get("effort") is not None:
        payload["reasoning_effort"] = request.reasoning["effort"]
    return payload


def input_messages(items: Union[str, list[Any]]) -> list[dict[str, Any]]:
    """Chat messages of a Responses `input`: a string is one user message; items in order, consecutive function
    calls joined into one assistant message (as chat templates expect parallel calls)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        field = f"input[{index}]"
        if not isinstance(item, dict):
            raise _bad(field, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, field))
        elif kind == "function_call":
            call = {"id": _text(item, "call_id", field), "type": "function",
                    "function": {"name": _text(item, "name", field), "arguments": _text(item, "arguments", field)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _parts_text(output, f"{field}.output")
            messages.append({"role": "tool", "tool_call_id": _text(item, "call_id", field), "content": output})
        elif kind == "reasoning":
            continue  # the model's earlier reasoning: chat templates drop it from past turns
        else:
            raise _bad(f"{field}.type", f"item type {kind!r} is not supported here (message, function_call, "
                       f"function_call_output, reasoning)")
    return messages


def _message(item: dict, field: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise _bad(f"{field}.role", f"must be one of {list(_ROLES)}")
    content = item.get("content")
    text = content if isinstance(content, str) else _parts_text(content, f"{field}.content")
    return {"role": "system" if role == "developer" else role, "content": text}


def _parts_text(parts: Any, field: str) -> str:
    """The text of content parts (input_text / output_text); images and files are refused by name."""
    if not isinstance(parts, list):
        raise _bad(field, "must be a string or a list of content parts")
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PART_TYPES or not isinstance(part.get("text"), str):
            raise _bad(f"{field}[{index}]", f"content part type {kind!r} is not supported; this server takes text "
                       f"parts only ({', '.join(_TEXT_PART_TYPES)})")
        texts.append(part["text"])
    return "".join(texts)


def _text(item: dict, key: str, field: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{field}.{key}", "must be a string")
    return value


def _chat_tool(tool: Any, index: int) -> dict[str, Any]:
    """A Responses function tool in the chat layout; hosted tools (web search ...) are refused by name."""
    field = f"tools[{index}]"
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        hosted = f" (a tool hosted by OpenAI: {kind!r})" if kind in _HOSTED_TOOLS else ""
        raise _bad(f"{field}.type", f"only function tools are supported{hosted}")
    function = {"name": _text(tool, "name", field)}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Union[str, dict]) -> Union[str, dict]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise _bad("tool_choice", 'must be "none", "auto", "required" or {"type": "function", "name": ...}')
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(format_: Any) -> dict[str, Any]:
    """text.format as chat's response_format: json_schema's schema sits beside its name here, one level down there."""
    kind = format_.get("type") if isinstance(format_, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(format_.get("schema"), dict):
            raise _bad("text.format.schema", "must be a JSON schema object")
        schema = {key: format_[key] for key in ("name", "schema", "strict", "description") if key in format_}
        schema.setdefault("name", "response")
        return {"type": "json_schema", "json_schema": schema}
    raise _bad("text.format.type", 'must be "text", "json_object" or "json_schema"')


def _bad(field: str, message: str) -> APIError:
    return APIError(400, f"{field}: {message}", param=field, code="invalid_value")
