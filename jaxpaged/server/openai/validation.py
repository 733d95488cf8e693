"""Hardened input: the body is read, decoded, parsed and checked here, before anything reaches the engine.

Every failure is an APIError with the OpenAI body (400, or 413 for a body over the limit); messages name the
field and the rule, never the value sent.
"""

import json
import math
from collections.abc import Sequence
from typing import Any, Optional, TypeVar

import pydantic
from fastapi import Request

from jaxpaged import inputs
from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams, logit_bias_token_id
from jaxpaged.server.http.errors import APIError, from_validation_errors, from_value_error
from jaxpaged.server.openai.protocol import MAX_STOP_STRINGS, SamplingRequest
from jaxpaged.server.vllm.bad_words import bad_words_token_ids

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


def check_json_content_type(request: Request) -> None:
    """415 unless the body is declared `application/json` (parameters such as charset allowed).

    A web page may POST text/plain or form bodies to any origin without a CORS preflight; refusing every other
    type keeps a browser from driving a keyless server on 127.0.0.1 (CSRF). 415 is HTTP's status for exactly this
    (RFC 9110 15.5.16), and vLLM's first version of the same check answered it; the body is the OpenAI error
    object, so clients handle it as any other 4xx.
    """
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise APIError(415, "Content-Type: the request body must be sent as application/json",
                       param="Content-Type", code="unsupported_media_type")


async def read_json_body(request: Request, max_body_bytes: int) -> Any:
    """The request body as JSON: declared application/json (415), size-capped (413), strict UTF-8, no
    NaN/Infinity, no lone surrogates (400)."""
    check_json_content_type(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise _too_large(max_body_bytes)
    chunks, num_bytes = [], 0
    async for chunk in request.stream():
        num_bytes += len(chunk)
        if num_bytes > max_body_bytes:  # a lying or absent Content-Length is caught while reading
            raise _too_large(max_body_bytes)
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not valid UTF-8", code="invalid_encoding") from None
    try:
        payload = json.loads(text, parse_constant=_reject_constant, parse_float=_parse_finite_float)
    except _NonFiniteNumber:
        raise APIError(400, "NaN and Infinity are not valid JSON numbers", code="invalid_value") from None
    except (ValueError, RecursionError):  # JSONDecodeError, over-long integers, absurd nesting
        raise APIError(400, "the request body is not valid JSON", code="invalid_json") from None
    if _has_lone_surrogate(payload):
        raise APIError(400, "the request body holds a lone UTF-16 surrogate (\\ud800-\\udfff)",
                       code="invalid_encoding")
    return payload


def parse_model(model_cls: type[ModelT], payload: Any) -> ModelT:
    """Validates a decoded body against a schema; 400 naming the first bad field."""
    try:
        return model_cls.model_validate(payload)
    except pydantic.ValidationError as error:
        raise from_validation_errors(error.errors(include_input=False, include_url=False)) from None


def check_prompt_count(payload: Any, max_prompts: int) -> None:
    """400 naming `prompt` when a completion body asks for more than max_prompts sequences (prompts × n).

    Runs on the decoded JSON, before pydantic and tokenization build an object per prompt: a 2 MiB body of
    `[[1],[1],...]` holds ~500k prompts, and validating them all on the event loop would stall every stream.
    """
    if not isinstance(payload, dict):
        return  # parse_model names the shape error
    prompt, n = payload.get("prompt"), payload.get("n")
    # A batch is a list of strings or of token-id lists; one list of ints is a single prompt.
    is_batch = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
    num_prompts = len(prompt) if is_batch and isinstance(prompt, list) else 1
    num_choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    if num_prompts * num_choices > max_prompts:
        raise APIError(400, f"prompt: a request may start at most {max_prompts} sequences (prompts in the batch "
                            f"times n; the server's --max-prompts-per-request)", param="prompt",
                       code="invalid_value")


def check_model_name(requested: Optional[str], served: Sequence[str]) -> None:
    """404 unless the request names one of the served model's names (or names none)."""
    if requested is not None and requested not in served:
        raise APIError(404, "the model does not exist; GET /v1/models lists the served one", param="model",
                       code="model_not_found")


def check_token_ids(token_ids: Sequence[int], vocab_size: int, field: str) -> None:
    """400 unless every id lies in [0, vocab_size) (the engine's own check, as an API error)."""
    try:
        inputs.check_token_ids(token_ids, vocab_size, field)
    except ValueError as error:
        raise from_value_error(error) from None


def resolve_max_tokens(requested: Optional[int], default: Optional[int], num_prompt_tokens: int,
                       max_model_len: int, field: str = "max_tokens") -> int:
    """The max_tokens to run with: the requested one if prompt + it fits, else 400; unset: default, clipped to fit."""
    room = max_model_len - num_prompt_tokens
    if num_prompt_tokens == 0:
        raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
    if room < 1:
        raise APIError(400, f"prompt: {num_prompt_tokens} tokens leave no room for output within "
                            f"max_model_len ({max_model_len})", param="prompt", code="context_length_exceeded")
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise APIError(400, f"{field}: prompt ({num_prompt_tokens} tokens) + {field} must be <= max_model_len "
                            f"({max_model_len})", param=field, code="context_length_exceeded")
    return requested


def build_sampling_params(request: SamplingRequest, *, max_tokens: int, logprobs: Optional[int],
                          vocab_size: int, max_n: int, model_defaults: Optional[dict] = None,
                          tool_constraint: Optional[StructuredOutputsParams] = None, tokenizer=None) -> SamplingParams:
    """SamplingParams from a validated request; 400 for n over max_n or token ids outside the vocabulary.

    `model_defaults` (the model's generation_config.json settings) fill the fields the request left unset;
    `tool_constraint` is the grammar of a tool_choice that calls tools (tool_calls.py); `tokenizer` spells the
    request's bad_words as token ids (needed when it has some).
    """
    unset = {key: value for key, value in (model_defaults or {}).items() if key not in request.model_fields_set}
    sampled = {key: unset.get(key, getattr(request, key))
               for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}
    # A top_k at or above the vocabulary keeps every token: clamped to it, as vLLM does (10**309 is valid JSON).
    if isinstance(sampled["top_k"], int) and sampled["top_k"] > vocab_size:
        sampled["top_k"] = vocab_size
    if request.n > max_n:
        raise APIError(400, f"n: must be <= {max_n} (the server's --max-n)", param="n", code="invalid_value")
    stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(400, f"stop: at most {MAX_STOP_STRINGS} stop strings", param="stop", code="invalid_value")
    if not all(stop):
        raise APIError(400, "stop: stop strings must not be empty", param="stop", code="invalid_value")
    if request.stop_token_ids:
        check_token_ids(request.stop_token_ids, vocab_size, "stop_token_ids")
    logit_bias = None
    if request.logit_bias:
        logit_bias = {}
        for key, bias in request.logit_bias.items():
            token_id = logit_bias_token_id(key)
            if token_id is None:  # not a decimal string, or too long to be a token id (a 5,000-digit key)
                raise APIError(400, "logit_bias: keys must be token ids written as decimal strings",
                               param="logit_bias", code="invalid_value")
            logit_bias[token_id] = bias
        check_token_ids(list(logit_bias), vocab_size, "logit_bias")
    if request.prompt_logprobs is not None and request.stream:  # as vLLM: they would have no chunk to ride on
        raise APIError(400, "prompt_logprobs: not available when stream is true", param="prompt_logprobs",
                       code="unsupported")
    if request.allowed_token_ids:
        check_token_ids(request.allowed_token_ids, vocab_size, "allowed_token_ids")
    bad_words = None
    if request.bad_words:
        assert tokenizer is not None, "bad_words need the tokenizer"
        bad_words = bad_words_token_ids(tokenizer, request.bad_words) or None
    structured = structured_outputs_of(request)
    if tool_constraint is not None:
        if structured is not None:
            raise APIError(400, f"{structured.field}: cannot be combined with a tool_choice that calls tools",
                           param=structured.field, code="invalid_value")
        structured = tool_constraint
    try:
        params = SamplingParams(
            n=request.n, **sampled, seed=request.seed, presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            logit_bias=logit_bias, stop=stop, stop_token_ids=request.stop_token_ids,
            include_stop_str_in_output=request.include_stop_str_in_output, max_tokens=max_tokens,
            min_tokens=request.min_tokens, ignore_eos=request.ignore_eos, logprobs=logprobs,
            skip_special_tokens=request.skip_special_tokens, structured_outputs=structured,
            allowed_token_ids=request.allowed_token_ids, bad_words_token_ids=bad_words,
            prompt_logprobs=request.prompt_logprobs)
        params.validate_token_ids(vocab_size)
    except ValueError as error:
        raise from_value_error(error) from None
    return params


_GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                  "guided_grammar": "grammar"}


def structured_outputs_of(request: SamplingRequest) -> Optional[StructuredOutputsParams]:
    """The request's one output constraint (structured_outputs, response_format or a guided_* field); 400 if it
    sets several."""
    given = [name for name in ("structured_outputs", "response_format", *_GUIDED_FIELDS)
             if getattr(request, name) is not None]
    fmt = request.response_format
    if fmt is not None and fmt.type == "text":
        given.remove("response_format")
    if len(given) > 1:
        raise APIError(400, f"{given[1]}: only one of structured_outputs, response_format, guided_json, "
                       f"guided_regex, guided_choice and guided_grammar may be set (got {', '.join(given)})",
                       param=given[1], code="invalid_value")
    if not given:
        return None
    name = given[0]
    if name == "structured_outputs":
        assert request.structured_outputs is not None
        fields = request.structured_outputs.model_dump(by_alias=True, exclude_none=True)
        try:
            return StructuredOutputsParams(**fields)
        except ValueError as error:
            raise from_value_error(error) from None
    if name == "response_format":
        assert fmt is not None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True, origin="response_format")
        if fmt.json_schema is None:
            raise APIError(400, "response_format.json_schema: required when type is \"json_schema\"",
                           param="response_format.json_schema", code="invalid_value")
        return StructuredOutputsParams(json=fmt.json_schema.schema_, origin="response_format.json_schema.schema")
    try:
        return StructuredOutputsParams(**{_GUIDED_FIELDS[name]: getattr(request, name)}, origin=name)
    except ValueError as error:
        raise from_value_error(error) from None


class _NonFiniteNumber(ValueError):
    pass


def _reject_constant(name: str) -> float:
    raise _NonFiniteNumber(name)


def _parse_finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise _NonFiniteNumber(text)
    return value


def _too_large(max_body_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than {max_body_bytes} bytes", code="request_too_large")


def _has_lone_surrogate(payload: Any) -> bool:
    """Whether any string (key or value) in a decoded JSON document cannot be encoded as UTF-8."""
    pending = [payload]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False
