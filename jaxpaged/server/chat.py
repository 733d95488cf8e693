"""POST /v1/chat/completions: the chat template renders the messages, then the engine runs one prompt, n choices."""

import time
import uuid
from collections.abc import AsyncIterator
from typing import Optional

from fastapi import Request
from fastapi.responses import Response

from jaxpaged.async_engine import EngineDeadError
from jaxpaged.outputs import CompletionOutput, RequestOutput
from jaxpaged.server.context import ServerContext
from jaxpaged.server.errors import APIError, error_body
from jaxpaged.server.generation import GenerationRun, ensure_ready, respond
from jaxpaged.server.prompts import chat_prompt
from jaxpaged.server.protocol import ChatCompletionRequest
from jaxpaged.server.responses import SampleProgress, chat_logprobs, usage
from jaxpaged.server.streaming import SSE_DONE, sse_event
from jaxpaged.server.tool_calls import ToolCalling, tool_calling
from jaxpaged.server.tool_parsers import make_tool_parser
from jaxpaged.server.validation import (
    build_sampling_params,
    check_model_name,
    parse_model,
    read_json_body,
    resolve_max_tokens,
)


async def create_chat_completion(request: Request, context: ServerContext) -> Response:
    """Validates, admits and runs one chat completion request."""
    ensure_ready(context)
    engine = context.engine
    body = parse_model(ChatCompletionRequest, await read_json_body(request, context.settings.max_request_body_bytes))
    check_model_name(body.model, engine.model_name)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs=true", param="top_logprobs", code="invalid_value")
    calling = tool_calling(body, make_tool_parser(context.settings.tool_call_parser))
    prompt = await chat_prompt(engine.tokenizer, engine.vocab_size, body.messages, body.add_generation_prompt,
                               cache_salt=body.cache_salt, priority=body.priority,
                               tools=calling.tools if calling else None)
    field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # NOTE: unset, the whole rest of the context is the limit (OpenAI's chat behaviour).
    max_tokens = resolve_max_tokens(requested, None, len(prompt.token_ids), engine.max_model_len, field)
    params = build_sampling_params(body, max_tokens=max_tokens, logprobs=(body.top_logprobs or 0) if body.logprobs
                                   else None, vocab_size=engine.vocab_size, max_n=context.settings.max_n,
                                   model_defaults=engine.sampling_defaults,
                                   tool_constraint=calling.constraint() if calling else None)
    run = GenerationRun(context, f"chatcmpl-{uuid.uuid4().hex}", [prompt], [params])
    view = _ChatView(body, engine.tokenizer, engine.model_name, run.request_id, calling)
    return await respond(request, run, body.stream, view.events, lambda finals: view.body(finals[0]))


class _ChatView:
    """Renders engine outputs as OpenAI chat completion objects (whole or chunked)."""

    def __init__(self, request: ChatCompletionRequest, tokenizer, model_name: str, response_id: str,
                 calling: Optional[ToolCalling] = None) -> None:
        self.request, self.tokenizer, self.calling = request, tokenizer, calling
        self.num_top = request.top_logprobs or 0
        self.header = {"id": response_id, "created": int(time.time()), "model": model_name}

    def _logprobs(self, sample: CompletionOutput, start: int, end: int) -> Optional[dict]:
        return chat_logprobs(self.tokenizer, sample, start, end, self.num_top) if self.request.logprobs else None

    def body(self, final: RequestOutput) -> dict:
        """The non-streaming response."""
        choices = []
        for sample in sorted(final.outputs, key=lambda sample: sample.index):
            message = self._message(sample)
            choices.append({"index": sample.index, "message": message,
                            "logprobs": self._logprobs(sample, 0, len(sample.token_ids)),
                            "finish_reason": self._finish_reason(sample.finish_reason, "tool_calls" in message),
                            "stop_reason": sample.stop_reason})
        return {**self.header, "object": "chat.completion", "choices": choices, "usage": usage([final])}

    def _message(self, sample: CompletionOutput) -> dict:
        calling = self.calling
        if calling is None:
            return {"role": "assistant", "content": sample.text}
        calls = calling.calls(sample.text)
        if calling.parser is not None:  # "auto": text, calls, or both
            if not calls:
                return {"role": "assistant", "content": sample.text}
            return {"role": "assistant", "content": calling.parser.content(sample.text), "tool_calls": calls}
        return {"role": "assistant", "content": None, "tool_calls": calls}

    def _finish_reason(self, reason: Optional[str], called: bool) -> Optional[str]:
        """`called`: the response carries tool_calls. OpenAI: "tool_calls" when the model chose to call tools; a
        forced (named) call finishes with "stop"."""
        if reason == "stop" and called and self.calling is not None and not self.calling.streams_arguments:
            return "tool_calls"
        return reason

    @staticmethod
    def _auto_delta(text: str, finished: bool, calling: ToolCalling, content_sent: list[int], index: int) -> dict:
        assert calling.parser is not None
        calls = calling.calls(text) if finished else []
        end = len(text) if finished and not calls else calling.parser.stream_content(text)
        delta: dict = {}
        if end > content_sent[index]:
            delta["content"] = text[content_sent[index]:end]
            content_sent[index] = end
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return delta

    def _first_delta(self) -> dict:
        if self.calling is None or self.calling.parser is not None:
            return {"role": "assistant", "content": ""}
        if not self.calling.streams_arguments:
            return {"role": "assistant", "content": None}
        call = self.calling.call(self.calling.forced_name or "", "")
        return {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}

    def _chunk(self, index: int, delta: dict, logprobs: Optional[dict], finish_reason: Optional[str]) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return sse_event({**self.header, "object": "chat.completion.chunk", "choices": [choice]})

    async def events(self, run: GenerationRun) -> AsyncIterator[str]:
        """The streaming response: a role chunk per choice, content deltas, optional usage, then [DONE]."""
        progress = [SampleProgress() for _ in range(self.request.n)]
        content_sent = [0] * self.request.n  # "auto": characters of each choice's text sent as content
        calling = self.calling
        try:
            for index in range(self.request.n):
                yield self._chunk(index, self._first_delta(), None, None)
            async for _, output in run.outputs():
                for sample in output.outputs:
                    delta = progress[sample.index].advance(sample, with_logprobs=self.request.logprobs)
                    if delta is None:
                        continue
                    if calling is None:
                        content = {"content": delta.text} if delta.text else {}
                    elif calling.parser is not None:  # "auto": content until a call may start, calls at the end
                        content = self._auto_delta(sample.text, delta.finish_reason is not None, calling,
                                                   content_sent, sample.index)
                    elif calling.streams_arguments:  # the forced function's arguments, as they are sampled
                        content = ({"tool_calls": [{"index": 0, "function": {"arguments": delta.text}}]}
                                   if delta.text else {})
                    else:  # "required": the calls are known once the array is complete
                        content = ({"tool_calls": [{"index": i, **call} for i, call in
                                                   enumerate(calling.calls(sample.text))]}
                                   if delta.finish_reason is not None else {})
                    yield self._chunk(sample.index, content,
                                      self._logprobs(sample, delta.start_token, delta.end_token),
                                      self._finish_reason(delta.finish_reason, "tool_calls" in content))
            if self.request.stream_options is not None and self.request.stream_options.include_usage:
                yield sse_event({**self.header, "object": "chat.completion.chunk", "choices": [],
                                 "usage": usage([final for final in run.finals if final is not None])})
        except EngineDeadError:
            yield sse_event(error_body(503, "the engine stopped before the request finished",
                                       code="engine_unavailable"))
        yield SSE_DONE
