"""POST /v1/completions: OpenAI's completions API on the engine, as one JSON body or as server-sent events."""

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Sequence

from fastapi import Request
from fastapi.responses import Response

from jaxpaged.inputs import ParsedPrompt
from jaxpaged.outputs import RequestOutput
from jaxpaged.server.context import ServerContext
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.generation import (
    STREAM_ENDING_ERRORS,
    GenerationRun,
    ensure_ready,
    respond,
    response_id,
    stream_error_body,
)
from jaxpaged.server.openai.prompt_truncation import requested_truncation, truncated
from jaxpaged.server.openai.prompts import completion_prompts
from jaxpaged.server.openai.protocol import CompletionRequest
from jaxpaged.server.openai.responses import (
    TOKEN_IDS,
    SampleProgress,
    completion_logprobs,
    join_logprobs,
    prompt_completion_logprobs,
    usage,
    vllm_prompt_logprobs,
)
from jaxpaged.server.openai.streaming import SSE_DONE, sse_event
from jaxpaged.server.openai.validation import (
    build_sampling_params,
    check_model_name,
    check_prompt_count,
    parse_model,
    read_json_body,
    resolve_max_tokens,
)
from jaxpaged.server.vllm.request_keys import reject_unhonoured_keys

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default max_tokens for completions (clipped to what fits in max_model_len)."""


async def create_completion(request: Request, context: ServerContext) -> Response:
    """Validates, admits and runs one completion request."""
    ensure_ready(context)
    engine = context.engine
    payload = await read_json_body(request, context.settings.max_request_body_bytes)
    check_prompt_count(payload, context.settings.max_prompts_per_request)
    reject_unhonoured_keys(payload, chat=False)
    body = parse_model(CompletionRequest, payload)
    check_model_name(body.model, context.request_model_names)
    _reject_unsupported(body)
    keep = requested_truncation(payload)
    prompts = [truncated(prompt, keep, engine.max_model_len)
               for prompt in await completion_prompts(body, engine.tokenizer, engine.vocab_size)]
    # max_tokens 0 (with echo: score the prompt) still samples one token, which the response leaves out.
    requested = 1 if body.max_tokens == 0 else body.max_tokens
    params = [build_sampling_params(
        body, max_tokens=resolve_max_tokens(requested, DEFAULT_MAX_TOKENS, len(prompt.token_ids),
                                            engine.max_model_len),
        logprobs=body.logprobs, vocab_size=engine.vocab_size, max_n=context.settings.max_n,
        model_defaults=engine.sampling_defaults, tokenizer=engine.tokenizer) for prompt in prompts]
    if body.echo and body.logprobs is not None:
        params = [dataclasses.replace(p, prompt_logprobs=max(body.logprobs, p.prompt_logprobs or 0)) for p in params]
    lora = context.lora_request_for(body.model)
    run = GenerationRun(context, f"cmpl-{uuid.uuid4().hex}", prompts, params, lora_request=lora)
    model_name = context.model_name if lora is None else lora.lora_name  # vLLM answers with the adapter's name
    view = _CompletionView(body, prompts, engine.tokenizer, model_name, response_id("cmpl", body, run),
                           context.settings.enable_prompt_tokens_details,
                           context.settings.spells_token_ids(body.return_tokens_as_token_ids))
    return await respond(request, run, body.stream, view.events, view.body)


def _reject_unsupported(body: CompletionRequest) -> None:
    if body.suffix:
        raise APIError(400, "suffix: is not supported", param="suffix", code="unsupported")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of: only best_of == n is supported", param="best_of", code="unsupported")
    if body.max_tokens == 0 and not body.echo:
        raise APIError(400, "max_tokens: 0 is only allowed with echo (scoring the prompt)", param="max_tokens",
                       code="invalid_value")
    if body.max_tokens == 0 and body.stream:
        raise APIError(400, "max_tokens: 0 is not supported when streaming", param="max_tokens",
                       code="unsupported")


class _CompletionView:
    """Renders engine outputs as OpenAI completion objects (whole or chunked)."""

    def __init__(self, body: CompletionRequest, prompts: list[ParsedPrompt], tokenizer, model_name: str,
                 response_id: str, with_cached_tokens: bool, spells_token_ids: bool = False) -> None:
        self.request, self.prompts, self.tokenizer = body, prompts, tokenizer
        self.spelling = TOKEN_IDS if spells_token_ids else tokenizer
        """What the logprobs spell tokens with: the tokenizer, or "token_id:<id>" (return_tokens_as_token_ids)."""
        self.with_cached_tokens = with_cached_tokens
        self.prompt_ids_sent: set[int] = set()
        """Choices whose stream has carried prompt_token_ids (return_token_ids)."""
        self.header = {"id": response_id, "object": "text_completion", "created": int(time.time()),
                       "model": model_name}

    def _echo_text(self, prompt_index: int) -> str:
        prompt = self.prompts[prompt_index]
        return prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids)

    def body(self, finals: list[RequestOutput]) -> dict:
        """The non-streaming response."""
        choices = []
        scoring_only = self.request.max_tokens == 0
        num_top = self.request.logprobs
        for prompt_index, final in enumerate(finals):
            prefix = self._echo_text(prompt_index) if self.request.echo else ""
            prompt_logprobs, offset = None, 0
            if self.request.echo and num_top is not None:
                prompt_logprobs, offset = prompt_completion_logprobs(self.spelling, final, num_top)
            for sample in final.outputs:
                logprobs = prompt_logprobs
                if num_top is not None and not scoring_only:
                    generated, _ = completion_logprobs(self.spelling, sample, 0, len(sample.token_ids), num_top,
                                                       offset)
                    logprobs = generated if prompt_logprobs is None else join_logprobs(prompt_logprobs, generated)
                choice = {"index": prompt_index * self.request.n + sample.index,
                          "text": prefix if scoring_only else prefix + sample.text, "logprobs": logprobs,
                          "finish_reason": "length" if scoring_only else sample.finish_reason,
                          "stop_reason": None if scoring_only else sample.stop_reason}
                if self.request.prompt_logprobs is not None:  # vLLM's: per choice, as each has its own prompt
                    choice["prompt_logprobs"] = vllm_prompt_logprobs(self.spelling, final,
                                                                     self.request.prompt_logprobs)
                if self.request.return_token_ids:  # vLLM's: per choice, as each choice has its own prompt
                    choice["prompt_token_ids"] = list(self.prompts[prompt_index].token_ids)
                    choice["token_ids"] = [] if scoring_only else list(sample.token_ids)
                choices.append(choice)
        choices.sort(key=lambda choice: choice["index"])
        total = usage(finals, with_cached_tokens=self.with_cached_tokens)
        if scoring_only:
            total["total_tokens"] -= total["completion_tokens"]
            total["completion_tokens"] = 0
        return {**self.header, "choices": choices, "usage": total}

    def _chunk(self, index: int, text: str, logprobs, finish_reason, num_tokens: int = 0,
               token_ids: Sequence[int] = ()) -> str:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        if self.request.return_token_ids:
            # vLLM's: the choice's prompt ids ride on its first chunk; each chunk carries the ids it adds.
            if index not in self.prompt_ids_sent:
                self.prompt_ids_sent.add(index)
                choice["prompt_token_ids"] = list(self.prompts[index // self.request.n].token_ids)
            choice["token_ids"] = list(token_ids)
        chunk = {**self.header, "choices": [choice]}
        options = self.request.stream_options
        if options is not None and options.continuous_usage_stats:  # vLLM's: this choice's usage so far
            num_prompt_tokens = len(self.prompts[index // self.request.n].token_ids)
            chunk["usage"] = {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_tokens,
                              "total_tokens": num_prompt_tokens + num_tokens}
        return sse_event(chunk)

    async def events(self, run: GenerationRun) -> AsyncIterator[str]:
        """The streaming response: one chunk per choice delta, optional usage, then [DONE]."""
        n, num_logprobs = self.request.n, self.request.logprobs
        with_logprobs = num_logprobs is not None
        progress = {(p, s): SampleProgress() for p in range(len(self.prompts)) for s in range(n)}
        text_offsets = {key: 0 for key in progress}
        try:
            echo_logprobs = self.request.echo and with_logprobs
            if self.request.echo and not echo_logprobs:
                for p in range(len(self.prompts)):
                    for s in range(n):
                        yield self._chunk(p * n + s, self._echo_text(p), None, None)
            echoed: set[int] = set()
            async for p, output in run.outputs():
                if echo_logprobs and p not in echoed and output.prompt_logprobs is not None \
                        and all(entry is not None for entry in output.prompt_logprobs[1:]):
                    # The prompt is scored by its prefill: it goes out, with its logprobs, before any token.
                    echoed.add(p)
                    assert num_logprobs is not None
                    prompt_logprobs, offset = prompt_completion_logprobs(self.spelling, output, num_logprobs)
                    for s in range(n):
                        text_offsets[(p, s)] = offset
                        yield self._chunk(p * n + s, self._echo_text(p), prompt_logprobs, None)
                for sample in output.outputs:
                    delta = progress[(p, sample.index)].advance(sample, with_logprobs=with_logprobs)
                    if delta is None:
                        continue
                    logprobs = None
                    if num_logprobs is not None:
                        logprobs, text_offsets[(p, sample.index)] = completion_logprobs(
                            self.spelling, sample, delta.start_token, delta.end_token, num_logprobs,
                            text_offsets[(p, sample.index)])
                    yield self._chunk(p * n + sample.index, delta.text, logprobs, delta.finish_reason,
                                      len(sample.token_ids), sample.token_ids[delta.start_token:delta.end_token])
            if self.request.stream_options is not None and self.request.stream_options.include_usage:
                finals = [final for final in run.finals if final is not None]
                total = usage(finals, with_cached_tokens=self.with_cached_tokens)
                yield sse_event({**self.header, "choices": [], "usage": total})
        except STREAM_ENDING_ERRORS as error:  # the engine stopped, or failed this request alone
            yield sse_event(stream_error_body(error))
        yield SSE_DONE
