"""POST /v1/chat/completions: the chat template renders the messages, then the engine runs one prompt, n choices."""

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Optional

from fastapi import Request
from fastapi.responses import Response

from jaxpaged.inputs import ParsedPrompt
from jaxpaged.outputs import CompletionOutput, RequestOutput
from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams
from jaxpaged.server.context import ServerContext
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.call_deltas import RequiredCallStream
from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.generation import (
    STREAM_ENDING_ERRORS,
    GenerationRun,
    ensure_ready,
    respond,
    response_id,
    stream_error_body,
)
from jaxpaged.server.openai.harmony_text import choice_text
from jaxpaged.server.openai.prompt_truncation import requested_truncation, truncated
from jaxpaged.server.openai.prompts import ChatRendering, chat_prompt
from jaxpaged.server.openai.protocol import ChatCompletionRequest
from jaxpaged.server.openai.responses import TOKEN_IDS, SampleProgress, chat_logprobs, usage, vllm_prompt_logprobs
from jaxpaged.server.openai.streaming import SSE_DONE, sse_event
from jaxpaged.server.openai.tool_calls import AUTO_TOOLS_ORIGIN, ToolCalling, prompt_tools, tool_calling
from jaxpaged.server.openai.validation import (
    build_sampling_params,
    check_model_name,
    check_prompt_count,
    parse_model,
    read_json_body,
    resolve_max_tokens,
    structured_outputs_of,
)
from jaxpaged.server.parsers.reasoning import ReasoningParser
from jaxpaged.server.vllm.request_keys import reject_unhonoured_keys


async def create_chat_completion(request: Request, context: ServerContext) -> Response:
    """Validates, admits and runs one chat completion request."""
    ensure_ready(context)
    payload = await read_json_body(request, context.settings.max_request_body_bytes)
    check_prompt_count(payload, context.settings.max_prompts_per_request)  # n alone may pass the cap
    reject_unhonoured_keys(payload, chat=True)
    body = parse_model(ChatCompletionRequest, payload)
    chat = await prepare_chat(body, context, requested_truncation(payload))
    spelling = TOKEN_IDS if context.settings.spells_token_ids(body.return_tokens_as_token_ids) else \
        context.engine.tokenizer
    view = _ChatView(body, spelling, chat.model_name, response_id("chatcmpl", body, chat.run),
                     chat.calling, chat.texts, chat.prompt.token_ids, context.settings.enable_prompt_tokens_details)
    return await respond(request, chat.run, body.stream, view.events, lambda finals: view.body(finals[0]))


@dataclasses.dataclass
class PreparedChat:
    """A validated chat request ready to run: its engine run and how its outputs read (shared by /v1/responses)."""

    run: GenerationRun
    calling: Optional[ToolCalling]
    """How the request calls tools (None: plain text)."""
    texts: list[Optional[ChoiceText]]
    """Per choice: its text's reasoning / content / "auto" calls (None for a forced or required call)."""
    prompt: ParsedPrompt
    model_name: str
    """The name responses carry: the served model's, or the LoRA adapter's the request named (as vLLM answers)."""


async def prepare_chat(body: ChatCompletionRequest, context: ServerContext,
                       truncation: Optional[int] = None) -> PreparedChat:
    """Renders, tokenizes and turns `body` into sampling parameters (400s naming the field for what cannot work);
    `truncation`: the request's truncate_prompt_tokens."""
    engine = context.engine
    check_model_name(body.model, context.request_model_names)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs=true", param="top_logprobs", code="invalid_value")
    calling = tool_calling(body, context.tool_parser)
    template_kwargs = context.settings.chat_template_kwargs_for(body.chat_template_kwargs, body.reasoning_effort)
    rendering = ChatRendering(body.add_generation_prompt, body.continue_final_message, context.settings.chat_template,
                              template_kwargs)
    tools = prompt_tools(body, calling, context.settings.exclude_tools_when_tool_choice_none)
    prompt = await chat_prompt(engine.tokenizer, engine.vocab_size, body.messages, rendering,
                               cache_salt=body.cache_salt, priority=body.priority, tools=tools)
    prompt = truncated(prompt, truncation, engine.max_model_len)
    field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    # NOTE: unset, the whole rest of the context is the limit (OpenAI's chat behaviour).
    max_tokens = resolve_max_tokens(requested, None, len(prompt.token_ids), engine.max_model_len, field)
    params = build_sampling_params(body, max_tokens=max_tokens, logprobs=(body.top_logprobs or 0) if body.logprobs
                                   else None, vocab_size=engine.vocab_size, max_n=context.settings.max_n,
                                   model_defaults=engine.sampling_defaults, tokenizer=engine.tokenizer,
                                   tool_constraint=_tool_constraint(body, calling))
    reasoning = context.reasoning_parser
    markers_are_special = (calling is not None and calling.parser is not None and calling.parser.keeps_special_tokens
                           ) or (reasoning is not None and reasoning.keeps_special_tokens)
    if markers_are_special and "skip_special_tokens" not in body.model_fields_set:
        params = dataclasses.replace(params, skip_special_tokens=False)  # the markers are special tokens
    if not context.settings.structured_outputs_in_reasoning:
        params = _grammar_after_reasoning(params, reasoning, calling, prompt.text)
    # NOTE: a constrained output that does not wait for the reasoning to end (a forced tool call, or a prompt that
    # closed the reasoning) starts with the answer, whatever the prompt opened; the "auto" tools grammar lets any
    # text (reasoning included) come first.
    structured = params.structured_outputs
    constrained = structured is not None and structured.origin != AUTO_TOOLS_ORIGIN and structured.starts_after is None
    starts_in_reasoning = reasoning is not None and not constrained and reasoning.starts_in_reasoning(prompt.text)
    lora = context.lora_request_for(body.model)
    run = GenerationRun(context, f"chatcmpl-{uuid.uuid4().hex}", [prompt], [params], lora_request=lora)
    texts = [choice_text(calling, reasoning, starts_in_reasoning, body.include_reasoning)
             if calling is None or calling.parser is not None
             else None for _ in range(body.n)]
    return PreparedChat(run, calling, texts, prompt, context.model_name if lora is None else lora.lora_name)


def _grammar_after_reasoning(params: SamplingParams, reasoning: Optional[ReasoningParser],
                             calling: Optional[ToolCalling], prompt_text: Optional[str]) -> SamplingParams:
    """With a reasoning parser, a schema, regex or grammar holds only after the reasoning ends (vLLM's rule), so a
    thinking model thinks first and then answers in the schema. Not for tool calls (their grammar is the call), nor
    when the prompt already closed the reasoning."""
    structured = params.structured_outputs
    if reasoning is None or structured is None or calling is not None or reasoning.ended_in_prompt(prompt_text):
        return params
    return dataclasses.replace(params, structured_outputs=dataclasses.replace(structured,
                                                                              starts_after=reasoning.end))


def _tool_constraint(body: ChatCompletionRequest, calling: Optional[ToolCalling]) -> Optional[StructuredOutputsParams]:
    """The grammar tool calling puts on the output: a forced call's, or for "auto" the parser's grammar of text or
    calls unless the request constrains the output itself (then its own constraint wins)."""
    if calling is None:
        return None
    if calling.parser is None:
        return calling.constraint()
    return calling.auto_constraint() if structured_outputs_of(body) is None else None


class _ChatView:
    """Renders engine outputs as OpenAI chat completion objects (whole or chunked)."""

    def __init__(self, request: ChatCompletionRequest, tokenizer, model_name: str, response_id: str,
                 calling: Optional[ToolCalling], texts: list[Optional[ChoiceText]], prompt_token_ids: Sequence[int],
                 with_cached_tokens: bool) -> None:
        self.request, self.tokenizer, self.calling = request, tokenizer, calling
        self.with_cached_tokens = with_cached_tokens
        self.texts = texts
        """Per choice: its text's reasoning / content / "auto" calls (None for a forced or required call)."""
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids)
        self.prompt_ids_sent = False
        """Whether the stream has carried prompt_token_ids (return_token_ids)."""
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
            if self.request.return_token_ids:
                choices[-1]["token_ids"] = list(sample.token_ids)
        response = {**self.header, "object": "chat.completion", "choices": choices,
                    "usage": usage([final], with_cached_tokens=self.with_cached_tokens)}
        if self.request.prompt_logprobs is not None:  # vLLM's: at the response's level, as prompt_token_ids
            response["prompt_logprobs"] = vllm_prompt_logprobs(self.tokenizer, final, self.request.prompt_logprobs)
        if self.request.return_token_ids:  # vLLM's: one prompt per chat request, so at the response's level
            response["prompt_token_ids"] = list(final.prompt_token_ids)
        return response

    def _message(self, sample: CompletionOutput) -> dict:
        text = self.texts[sample.index]
        if text is not None:
            return text.message(sample.text)
        assert self.calling is not None
        return {"role": "assistant", "content": None, "tool_calls": self.calling.calls(sample.text)}

    def _finish_reason(self, reason: Optional[str], called: bool) -> Optional[str]:
        """`called`: the response carries tool_calls. OpenAI: "tool_calls" when the model chose to call tools; a
        forced (named) call finishes with "stop"."""
        if reason == "stop" and called and self.calling is not None and not self.calling.streams_arguments:
            return "tool_calls"
        return reason

    def _first_delta(self) -> dict:
        if self.calling is None or self.calling.parser is not None:
            return {"role": "assistant", "content": ""}
        if not self.calling.streams_arguments:
            return {"role": "assistant", "content": None}
        call = self.calling.call(self.calling.forced_name or "", "")
        return {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}

    def _chunk(self, index: int, delta: dict, logprobs: Optional[dict], finish_reason: Optional[str],
               num_tokens: int = 0, token_ids: Sequence[int] = ()) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        chunk = {**self.header, "object": "chat.completion.chunk", "choices": [choice]}
        if self.request.return_token_ids:
            # vLLM's: the prompt ids ride on the stream's first chunk; each chunk carries the ids it adds.
            choice["token_ids"] = list(token_ids)
            if not self.prompt_ids_sent:
                self.prompt_ids_sent = True
                chunk["prompt_token_ids"] = list(self.prompt_token_ids)
        options = self.request.stream_options
        if options is not None and options.continuous_usage_stats:  # vLLM's: this choice's usage so far
            chunk["usage"] = {"prompt_tokens": self.num_prompt_tokens, "completion_tokens": num_tokens,
                              "total_tokens": self.num_prompt_tokens + num_tokens}
        return sse_event(chunk)

    async def events(self, run: GenerationRun) -> AsyncIterator[str]:
        """The streaming response: a role chunk per choice, content deltas, optional usage, then [DONE]."""
        progress = [SampleProgress() for _ in range(self.request.n)]
        calling = self.calling
        required: dict[int, RequiredCallStream] = {}  # per choice, tool_choice "required"'s calls so far
        try:
            for index in range(self.request.n):
                yield self._chunk(index, self._first_delta(), None, None)
            async for _, output in run.outputs():
                for sample in output.outputs:
                    delta = progress[sample.index].advance(sample, with_logprobs=self.request.logprobs)
                    if delta is None:
                        continue
                    text = self.texts[sample.index]
                    if text is not None:  # reasoning, then content until a call may start, "auto" calls at the end
                        content = text.delta(sample.text, delta.finish_reason is not None)
                    elif calling is not None and calling.streams_arguments:  # the forced function's arguments
                        content = ({"tool_calls": [{"index": 0, "function": {"arguments": delta.text}}]}
                                   if delta.text else {})
                    else:  # "required": each call's name, then its parameters as they are sampled
                        assert calling is not None
                        if sample.index not in required:
                            required[sample.index] = RequiredCallStream(calling)
                        content = required[sample.index].delta(sample.text, delta.finish_reason is not None)
                    called = text if text is not None else required.get(sample.index)
                    yield self._chunk(sample.index, content,
                                      self._logprobs(sample, delta.start_token, delta.end_token),
                                      self._finish_reason(delta.finish_reason, "tool_calls" in content or (
                                          called is not None and called.num_calls_sent > 0)),
                                      len(sample.token_ids), sample.token_ids[delta.start_token:delta.end_token])
            if self.request.stream_options is not None and self.request.stream_options.include_usage:
                yield sse_event({**self.header, "object": "chat.completion.chunk", "choices": [],
                                 "usage": usage([final for final in run.finals if final is not None],
                                               with_cached_tokens=self.with_cached_tokens)})
        except STREAM_ENDING_ERRORS as error:  # the engine stopped, or failed this request alone
            yield sse_event(stream_error_body(error))
        yield SSE_DONE
