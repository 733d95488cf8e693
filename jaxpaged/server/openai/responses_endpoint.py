"""POST /v1/responses: OpenAI's Responses API over the chat path (stateless; text and function tools), whole or as
its typed stream of events.

The request becomes a chat completion (responses_input.py) and runs through the same preparation, so templates,
tool parsers, reasoning parsers, structured outputs and sampling behave exactly as on /v1/chat/completions. The
outputs are rendered as Responses output items: a `reasoning` item, a `message` item with one `output_text` part, and
one `function_call` item per call. Streaming sends OpenAI's events in order, each item opened (`output_item.added`),
filled by deltas and closed (`output_item.done`), between `response.created` and `response.completed` (or
`response.incomplete` when max_output_tokens cut it short).
"""

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional

from fastapi import Request
from fastapi.responses import Response

from jaxpaged.outputs import CompletionOutput, RequestOutput
from jaxpaged.server.context import ServerContext
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.chat import PreparedChat, prepare_chat
from jaxpaged.server.openai.generation import (
    STREAM_ENDING_ERRORS,
    GenerationRun,
    ensure_ready,
    respond,
    stream_error_body,
)
from jaxpaged.server.openai.protocol import ChatCompletionRequest
from jaxpaged.server.openai.responses import SampleProgress
from jaxpaged.server.openai.responses_input import ResponsesRequest, chat_payload
from jaxpaged.server.openai.validation import parse_model, read_json_body


async def create_response(request: Request, context: ServerContext) -> Response:
    """Validates, admits and runs one Responses API request."""
    ensure_ready(context)
    payload = await read_json_body(request, context.settings.max_request_body_bytes)
    body = parse_model(ResponsesRequest, payload)
    chat_body = parse_model(ChatCompletionRequest, chat_payload(body, payload))
    chat = await prepare_chat(chat_body, context)
    view = _ResponseView(body, chat_body, chat, chat.model_name, context.settings.enable_prompt_tokens_details)
    return await respond(request, chat.run, body.stream, view.events, lambda finals: view.response(finals[0]))


class _ResponseView:
    """Renders the engine's outputs as a Response object, or as the events that build it."""

    def __init__(self, request: ResponsesRequest, chat_request: ChatCompletionRequest, chat: PreparedChat,
                 model_name: str, with_cached_tokens: bool) -> None:
        self.request, self.chat, self.with_cached_tokens = request, chat, with_cached_tokens
        self.sampling = {"temperature": chat_request.temperature, "top_p": chat_request.top_p}
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.model_name = model_name
        self.sequence_number = 0

    def response(self, final: Optional[RequestOutput], output: Optional[list[dict]] = None) -> dict:
        """The Response object: in progress (no final yet) or finished with its output items and usage."""
        sample = final.outputs[0] if final is not None else None
        if output is None:
            output = self._output_items(sample) if sample is not None else []
        status, incomplete = "in_progress", None
        if sample is not None:
            status = "incomplete" if sample.finish_reason == "length" else "completed"
            incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        request = self.request
        return {"id": self.id, "object": "response", "created_at": self.created_at, "model": self.model_name,
                "status": status, "error": None, "incomplete_details": incomplete,
                "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
                "metadata": request.metadata or {}, "output": output,
                "parallel_tool_calls": request.parallel_tool_calls is not False,
                **self.sampling,
                "tool_choice": request.tool_choice or "auto", "tools": request.tools or [],
                "text": request.text or {"format": {"type": "text"}}, "reasoning": request.reasoning,
                "store": False, "usage": self._usage(final) if final is not None else None}

    def _usage(self, final: RequestOutput) -> dict:
        sample = final.outputs[0]
        input_tokens, output_tokens = len(final.prompt_token_ids), len(sample.token_ids)
        cached = final.num_cached_tokens if self.with_cached_tokens else 0
        return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens}

    def _message_fields(self, sample: CompletionOutput) -> dict:
        """The chat message the sample reads as (reasoning, content, tool_calls)."""
        text = self.chat.texts[sample.index]
        if text is not None:
            return text.message(sample.text)
        assert self.chat.calling is not None
        return {"content": None, "tool_calls": self.chat.calling.calls(sample.text)}

    def _output_items(self, sample: CompletionOutput) -> list[dict]:
        message = self._message_fields(sample)
        items = []
        if message.get("reasoning"):
            items.append(_reasoning_item(f"rs_{uuid.uuid4().hex}", message["reasoning"], "completed"))
        if message.get("content"):
            items.append(_message_item(f"msg_{uuid.uuid4().hex}", message["content"], "completed"))
        for call in message.get("tool_calls") or []:
            items.append(_call_item(call, "completed"))
        return items

    def _event(self, kind: str, **fields: Any) -> str:
        """One typed server-sent event (OpenAI's: an `event:` line naming the type, and the numbered payload)."""
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"

    async def events(self, run: GenerationRun) -> AsyncIterator[str]:
        """The stream: created, in_progress, each item's events, then completed / incomplete (or an error)."""
        yield self._event("response.created", response=self.response(None))
        yield self._event("response.in_progress", response=self.response(None))
        items = _StreamedItems(self)
        progress = SampleProgress()
        calling, text = self.chat.calling, self.chat.texts[0]
        try:
            async for _, output in run.outputs():
                sample = output.outputs[0]
                delta = progress.advance(sample, with_logprobs=False)
                if delta is None:
                    continue
                finished = delta.finish_reason is not None
                if text is not None:  # reasoning, content, then "auto" calls as the parser completes them
                    parts = text.delta(sample.text, finished)
                    for event in items.add(parts.get("reasoning"), parts.get("content"), parts.get("tool_calls")):
                        yield event
                elif calling is not None and calling.streams_arguments:  # a named function's arguments
                    for event in items.arguments(calling.forced_name or "", delta.text):
                        yield event
                elif finished:  # "required": the calls are known once the array is complete
                    assert calling is not None
                    for event in items.add(None, None, [{"index": i, **call}
                                                        for i, call in enumerate(calling.calls(sample.text))]):
                        yield event
                if finished:
                    for event in items.close_open():
                        yield event
                    response = self.response(output, items.done)
                    yield self._event(f"response.{response['status']}", response=response)
        except STREAM_ENDING_ERRORS as error:  # the engine stopped, or failed this request alone
            detail = stream_error_body(error)["error"]
            yield self._event("error", code=detail.get("code"), message=detail.get("message"), param=None)
        except APIError as error:
            yield self._event("error", code=error.code, message=error.message, param=error.param)


class _StreamedItems:
    """The output items of a stream: at most one open at a time, each closed before the next opens."""

    def __init__(self, view: _ResponseView) -> None:
        self.view = view
        self.done: list[dict] = []
        """Closed items, in output order (the final response's output)."""
        self.open: Optional[dict] = None
        self.open_text = ""
        """The open item's text (reasoning, output text, or a call's arguments) so far."""
        self.open_call_index = -1
        """The chat tool_calls index of the open function_call item."""

    def _index(self) -> int:
        return len(self.done)

    def _start(self, item: dict) -> list[str]:
        self.open, self.open_text = item, ""
        events = [self.view._event("response.output_item.added", output_index=self._index(), item=item)]
        if item["type"] == "message":
            events.append(self.view._event("response.content_part.added", item_id=item["id"],
                                           output_index=self._index(), content_index=0, part=_text_part("")))
        return events

    def _switch_to(self, kind: str) -> list[str]:
        if self.open is not None and self.open["type"] == kind:
            return []
        events = self.close_open()
        if kind == "reasoning":
            events += self._start(_reasoning_item(f"rs_{uuid.uuid4().hex}", "", "in_progress"))
        else:
            events += self._start(_message_item(f"msg_{uuid.uuid4().hex}", "", "in_progress"))
        return events

    def add(self, reasoning: Optional[str], content: Optional[str], calls: Optional[list[dict]]) -> list[str]:
        """Events for new reasoning text, new content text and the chat stream's tool_calls entries (in that
        order): a call's item opens at its first entry and takes its arguments as they come; the next item closes
        it."""
        events: list[str] = []
        for kind, new_text in (("reasoning", reasoning), ("message", content)):
            if not new_text:
                continue
            events += self._switch_to(kind)
            assert self.open is not None
            self.open_text += new_text
            delta_kind = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            events.append(self.view._event(delta_kind, item_id=self.open["id"], output_index=self._index(),
                                           content_index=0, delta=new_text, **extra))
        for entry in calls or []:  # a call's first entry (id, name), then fragments of its arguments
            if "id" in entry:
                events += self.close_open()
                events += self._start(_call_item(entry, "in_progress", arguments=""))
                self.open_call_index = entry["index"]
            if entry["function"]["arguments"] and self.open is not None and \
                    self.open_call_index == entry["index"]:
                events += self.arguments_delta(entry["function"]["arguments"])
        return events

    def arguments(self, name: str, new_text: str) -> list[str]:
        """A named function's arguments as they are sampled: its item opens on the first text."""
        events: list[str] = []
        if self.open is None:
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "function": {"name": name, "arguments": ""}}
            events += self._start(_call_item(call, "in_progress"))
        return events + (self.arguments_delta(new_text) if new_text else [])

    def arguments_delta(self, new_text: str) -> list[str]:
        assert self.open is not None
        self.open_text += new_text
        return [self.view._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                 output_index=self._index(), delta=new_text)]

    def close_open(self) -> list[str]:
        """The events that close the open item (none open: none)."""
        item, text = self.open, self.open_text
        if item is None:
            return []
        self.open, self.open_text = None, ""
        index, events = self._index(), []
        if item["type"] == "reasoning":
            events.append(self.view._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                           content_index=0, text=text))
            item = _reasoning_item(item["id"], text, "completed")
        elif item["type"] == "message":
            events.append(self.view._event("response.output_text.done", item_id=item["id"], output_index=index,
                                           content_index=0, text=text, logprobs=[]))
            events.append(self.view._event("response.content_part.done", item_id=item["id"], output_index=index,
                                           content_index=0, part=_text_part(text)))
            item = _message_item(item["id"], text, "completed")
        else:
            events.append(self.view._event("response.function_call_arguments.done", item_id=item["id"],
                                           output_index=index, name=item["name"], arguments=text))
            item = {**item, "arguments": text, "status": "completed"}
        events.append(self.view._event("response.output_item.done", output_index=index, item=item))
        self.done.append(item)
        return events


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str) -> dict:
    content = [_text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def _call_item(call: dict, status: str, arguments: Optional[str] = None) -> dict:
    """A function_call item of a chat tool call ({"id", "function": {"name", "arguments"}})."""
    function = call["function"]
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.get("id") or
            f"call_{uuid.uuid4().hex[:24]}", "name": function["name"],
            "arguments": function["arguments"] if arguments is None else arguments, "status": status}
