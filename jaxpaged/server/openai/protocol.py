"""Pydantic schemas of the OpenAI-compatible requests: completions, chat completions, tokenize, detokenize.

Strict on purpose: no string-to-number coercion, no NaN or Infinity, bounded numbers. Limits that depend on
the model or the server's flags (vocabulary, max_model_len, --max-n) are checked later, in validation.py.
Unknown fields are ignored, as OpenAI clients send fields this server has no use for (user, metadata, ...).
"""

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from jaxpaged.server.vllm.bad_words import MAX_BAD_WORDS

MAX_STOP_STRINGS = 16
"""Most stop strings one request may give."""

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token that logprobs / top_logprobs may ask for (the OpenAI limit)."""

_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1

TokenId = Annotated[int, Field(ge=0)]
BiasValue = float
"""A logit_bias value: any finite number, clamped to [-100, 100] (as vLLM does) by SamplingParams."""


class StrictModel(BaseModel):
    """Base of every request schema: strict types, finite floats, unknown fields ignored, null = not given."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        # OpenAI's parameters are nullable: clients send "n": null or "stop": null to mean "not set".
        return {key: value for key, value in data.items() if value is not None} if isinstance(data, dict) else data


class StreamOptions(StrictModel):
    """OpenAI's stream_options."""

    include_usage: bool = False
    """Send a last chunk (with no choices) that carries the usage."""
    continuous_usage_stats: bool = False
    """vLLM's: every chunk carries the usage of its choice so far."""


class StructuredOutputs(StrictModel):
    """vLLM's structured_outputs extra body: exactly one constraint on the output."""

    json_: Union[dict[str, Any], str, None] = Field(None, alias="json")
    """The output follows this JSON schema."""
    regex: Optional[str] = None
    """The output matches this regular expression."""
    choice: Optional[list[str]] = Field(None, min_length=1)
    """The output is one of these strings."""
    grammar: Optional[str] = None
    """The output follows this Lark grammar (llguidance's dialect)."""
    json_object: Optional[bool] = None
    """The output is any JSON object."""


class JsonSchemaFormat(StrictModel):
    """OpenAI's response_format.json_schema."""

    name: str = "response"
    description: Optional[str] = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    """The JSON schema the output must validate against ({} allows any JSON value)."""
    strict: Optional[bool] = None
    """Accepted; outputs always follow the schema exactly."""


class ResponseFormat(StrictModel):
    """OpenAI's response_format: plain text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class SamplingRequest(StrictModel):
    """Fields shared by completions and chat completions: model, sampling, stopping, streaming."""

    return_tokens_as_token_ids: Optional[bool] = None
    """vLLM's: logprobs spell every token "token_id:<id>" (None: as the server's --return-tokens-as-token-ids)."""

    model: Optional[str] = None
    """Must name the served model when given (else 404)."""
    n: int = Field(1, ge=1)
    """Choices to generate (at most --max-n)."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    """0 is greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    top_k: int = Field(0, ge=-1)
    """0 or -1 turn it off; a top_k above the vocabulary is clamped to it (validation.py)."""
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    """Relative probability floor."""
    seed: Optional[int] = Field(None, ge=_INT64_MIN, le=_UINT64_MAX)
    """Makes sampling reproducible."""
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """OpenAI presence penalty."""
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """OpenAI frequency penalty."""
    repetition_penalty: float = Field(1.0, gt=0.0, le=100.0)
    """HF-style repetition penalty; 1 is off."""
    logit_bias: Optional[dict[str, BiasValue]] = None
    """Token id (as a decimal string) -> bias, clamped to [-100, 100]."""
    stop: Union[str, list[str], None] = None
    """Up to 16 non-empty stop strings (counted in validation.py, for a clearer message than a union's)."""
    stop_token_ids: Optional[list[TokenId]] = None
    """Token ids that end a choice."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string in the text."""
    max_tokens: Optional[int] = Field(None, ge=1)
    """Most tokens per choice; prompt + max_tokens must fit in max_model_len."""
    min_tokens: int = Field(0, ge=0)
    """EOS and stop tokens are blocked before this many tokens."""
    ignore_eos: bool = False
    """Keep generating past EOS."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text."""
    stream: bool = False
    """Answer with server-sent events."""
    stream_options: Optional[StreamOptions] = None
    """include_usage."""
    cache_salt: Optional[str] = Field(None, min_length=1, max_length=1024)
    """Isolates this request's prefix-cache entries from requests with another salt."""
    priority: int = Field(0, ge=_INT64_MIN, le=2**63 - 1)
    """Lower runs first under the priority scheduling policy."""
    response_format: Optional[ResponseFormat] = None
    """Structured output, OpenAI's way ("json_object" or "json_schema")."""
    structured_outputs: Optional[StructuredOutputs] = None
    """vLLM's extra body (since v0.12; guided_* before): json, regex, choice, grammar or json_object."""
    guided_json: Union[dict[str, Any], str, None] = None
    """vLLM's extra body: the output follows this JSON schema."""
    guided_regex: Optional[str] = None
    """vLLM's extra body: the output matches this regular expression."""
    guided_choice: Optional[list[str]] = Field(None, min_length=1)
    """vLLM's extra body: the output is one of these strings."""
    guided_grammar: Optional[str] = None
    """vLLM's extra body: the output follows this Lark grammar (llguidance's dialect)."""
    request_id: Optional[str] = Field(None, min_length=1, max_length=256)
    """vLLM's: the response id is "cmpl-<request_id>" / "chatcmpl-<request_id>" (the engine's id stays unique)."""
    allowed_token_ids: Optional[list[TokenId]] = Field(None, min_length=1)
    """vLLM's: only these token ids may be sampled."""
    bad_words: Optional[list[Annotated[str, Field(min_length=1)]]] = Field(None, max_length=MAX_BAD_WORDS)
    """vLLM's: words the output must not spell (a word's last token is banned after its other tokens)."""
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    """vLLM's: each prompt token's logprob and this many alternatives (not when streaming)."""
    return_token_ids: bool = False
    """vLLM's: each choice carries its output `token_ids`, and the response its `prompt_token_ids`."""


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    max_tokens: Optional[int] = Field(None, ge=0)
    """Most tokens per choice; 0 (with echo) scores the prompt and generates nothing."""
    prompt: Union[str, list[TokenId], list[str], list[list[TokenId]]]
    """One prompt (text or token ids) or a batch of them."""
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    """Top alternatives per generated token (0..20)."""
    echo: bool = False
    """Put the prompt in front of the completion text (and, with logprobs, its tokens' logprobs)."""
    suffix: Optional[str] = None
    """Not supported (only None or "")."""
    best_of: Optional[int] = Field(None, ge=1)
    """Only None or equal to n is supported."""


_MEDIA_PART_TYPES = {"image_url": "images are", "input_image": "images are", "image": "images are",
                     "input_audio": "audio is", "audio_url": "audio is", "video_url": "video is", "file": "files are"}
"""OpenAI / vLLM content-part types that carry media, which the engine (text models only) cannot take."""


class TextPart(StrictModel):
    """One text part of a message's content."""

    type: Literal["text"]
    text: str


class FunctionCall(StrictModel):
    """A function call an assistant message made earlier in the conversation."""

    name: str
    arguments: str
    """The arguments as JSON text."""


class ToolCall(StrictModel):
    """One entry of an assistant message's tool_calls."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(StrictModel):
    """One message of a conversation."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    """An assistant message's calls (passed to the chat template)."""
    tool_call_id: Optional[str] = None
    """A tool message: the call it answers."""
    reasoning: Optional[str] = None
    """An assistant message's reasoning (vLLM's current name), passed to the chat template for interleaved
    thinking."""
    reasoning_content: Optional[str] = None
    """The same under its former name (DeepSeek's, still sent by many clients); `reasoning` wins."""

    @model_validator(mode="before")
    @classmethod
    def _text_parts_only(cls, data: Any) -> Any:
        # A multimodal checkpoint is served by its text tower alone (models/families/text_towers.py): an image
        # part is refused by name, not with pydantic's "Input should be 'text'".
        content = data.get("content") if isinstance(data, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in _MEDIA_PART_TYPES:  # a known name: no client text comes back
                raise PydanticCustomError(
                    "unsupported_content", "content: {what} not supported (content part type {kind}); this server "
                    "takes text parts only", {"what": _MEDIA_PART_TYPES[kind], "kind": repr(kind)})
        return data


class FunctionDefinition(StrictModel):
    """A function the model may call."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    """The arguments' JSON schema (None: any object)."""
    strict: Optional[bool] = None


class Tool(StrictModel):
    """One entry of tools."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    """tool_choice naming one function: the model must call exactly it."""

    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    """The conversation; the chat template renders it."""
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    """OpenAI's newer name for max_tokens; wins when both are given."""
    logprobs: bool = False
    """Return the sampled tokens' logprobs."""
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    """Alternatives per token (needs logprobs=true)."""
    add_generation_prompt: bool = True
    """End the rendered prompt with the assistant header."""
    tools: Optional[list[Tool]] = None
    """Functions the model may call."""
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    """"none", "auto" (the default with tools), "required", or {"type": "function", "function": {"name": ...}}."""
    chat_template_kwargs: Optional[dict[str, Any]] = None
    """vLLM's: extra variables for the chat template (enable_thinking: false, ...)."""
    continue_final_message: bool = False
    """vLLM's: the prompt ends inside the last (assistant) message, which the output continues."""
    include_reasoning: bool = True
    """vLLM's: false leaves the reasoning parser's `reasoning` out of the response (content is unchanged)."""
    parallel_tool_calls: Optional[bool] = True
    """OpenAI's: false allows at most one tool call per choice (a "required" grammar then holds one call)."""
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None
    """OpenAI's: reaches the chat template as `reasoning_effort` (gpt-oss's and other thinking models' templates
    read it; others ignore it)."""


class TokenizeRequest(StrictModel):
    """POST /tokenize: a text prompt or chat messages."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: bool = True
    """For a text prompt: let the tokenizer add its BOS etc."""
    add_generation_prompt: bool = True
    """For messages: end with the assistant header."""
    chat_template_kwargs: Optional[dict[str, Any]] = None
    """For messages: extra variables for the chat template."""


class DetokenizeRequest(StrictModel):
    """POST /detokenize."""

    model: Optional[str] = None
    tokens: list[TokenId]
