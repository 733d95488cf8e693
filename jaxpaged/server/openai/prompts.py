"""Turns request prompts (text, token ids, chat messages) into checked token ids for the engine.

The server tokenizes, so every length and vocabulary check happens here, before the engine sees the request.
Tokenizing runs in a worker thread: a 2 MiB prompt must not stall the event loop that streams other requests.
"""

import dataclasses
from typing import Any, Optional, Union, cast

from starlette.concurrency import run_in_threadpool

from jaxpaged.inputs import ParsedPrompt
from jaxpaged.server.http.errors import APIError, from_value_error
from jaxpaged.server.openai.protocol import ChatMessage, CompletionRequest, TokenId


def _engine_prompt(token_ids: list[int], vocab_size: int, text: Optional[str], cache_salt: Optional[str],
                   priority: int) -> ParsedPrompt:
    try:
        return ParsedPrompt.from_token_ids(token_ids, vocab_size, text=text, cache_salt=cache_salt,
                                           priority=priority, field="prompt")
    except ValueError as error:
        raise from_value_error(error) from None


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


async def tokenize_text(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of a text, computed off the event loop."""
    return await run_in_threadpool(_encode, tokenizer, text, add_special_tokens)


async def completion_prompts(request: CompletionRequest, tokenizer: Any, vocab_size: int) -> list[ParsedPrompt]:
    """The engine prompts of a completion request (one, or a batch); 400 for an empty one or out-of-vocabulary ids."""
    prompt = request.prompt
    # One text, one prompt's token ids, or a batch of either: pydantic has checked the shape, but the element
    # type cannot be narrowed from prompt[0].
    items = cast(list[Union[str, list[TokenId]]],
                 [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt))
    if not items:
        raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
    prompts = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
            token_ids, text = await tokenize_text(tokenizer, item), item
        else:
            if not item:
                raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
            token_ids, text = list(item), None
        prompts.append(_engine_prompt(token_ids, vocab_size, text, request.cache_salt, request.priority))
    return prompts


def _message_dict(message: ChatMessage) -> dict:
    if message.content is None:
        content = ""
    elif isinstance(message.content, str):
        content = message.content
    else:
        content = "\n".join(part.text for part in message.content)
    rendered: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        rendered["name"] = message.name
    if message.tool_calls:
        rendered["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    reasoning = message.reasoning if message.reasoning is not None else message.reasoning_content
    if reasoning is not None:  # templates read either name (Qwen3's reads reasoning_content)
        rendered["reasoning"] = rendered["reasoning_content"] = reasoning
    return rendered


_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})


MAX_SHOWN_KEY_CHARS = 32
"""Characters of a refused chat_template_kwargs key that its error repeats."""


def _shown_key(key: str) -> str:
    return key if len(key) <= MAX_SHOWN_KEY_CHARS else key[:MAX_SHOWN_KEY_CHARS] + "..."


@dataclasses.dataclass(frozen=True)
class ChatRendering:
    """How a conversation is rendered: the template and its options besides the messages and tools."""

    add_generation_prompt: bool = True
    """End with the assistant header."""
    continue_final_message: bool = False
    """End inside the last message, for the output to continue it."""
    chat_template: Optional[str] = None
    """The server's --chat-template (None: the model's own)."""
    template_kwargs: Optional[dict[str, Any]] = None
    """The request's chat_template_kwargs: extra template variables."""

    def check(self) -> None:
        """400 naming the field for options that cannot be rendered."""
        if self.continue_final_message and self.add_generation_prompt:
            raise APIError(400, "continue_final_message: cannot be combined with add_generation_prompt=true",
                           param="continue_final_message", code="invalid_value")
        for key in self.template_kwargs or {}:
            if key in _RESERVED_TEMPLATE_KWARGS or not key.isidentifier():
                # NOTE: the key is the client's text; a megabyte-long one must not come back in the error.
                field = f"chat_template_kwargs.{_shown_key(key)}"
                raise APIError(400, f"{field}: not a template variable a request may set", param=field,
                               code="invalid_value")


def render_chat(tokenizer: Any, messages: list[ChatMessage], rendering: ChatRendering,
                tools: Optional[list[dict]] = None) -> str:
    """The conversation rendered by the chat template; 400 if the template rejects it."""
    rendering.check()
    if rendering.chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise APIError(400, "messages: this model has no chat template; use /v1/completions", param="messages",
                       code="invalid_value")
    try:
        return tokenizer.apply_chat_template([_message_dict(m) for m in messages], tokenize=False,
                                             add_generation_prompt=rendering.add_generation_prompt, tools=tools,
                                             continue_final_message=rendering.continue_final_message,
                                             chat_template=rendering.chat_template,
                                             **(rendering.template_kwargs or {}))
    except Exception as error:  # jinja TemplateError and friends: the template refused these messages
        raise APIError(400, f"messages: the chat template rejected them ({type(error).__name__})",
                       param="messages", code="invalid_value") from None


async def chat_prompt(tokenizer: Any, vocab_size: int, messages: list[ChatMessage], rendering: ChatRendering, *,
                      cache_salt: Optional[str], priority: int, tools: Optional[list[dict]] = None) -> ParsedPrompt:
    """The engine prompt of a chat: rendered (with the tools, for templates that show them) and tokenized (the
    template already holds the special tokens)."""
    text, token_ids = await tokenize_chat(tokenizer, messages, rendering, tools)
    return _engine_prompt(token_ids, vocab_size, text, cache_salt, priority)


async def tokenize_chat(tokenizer: Any, messages: list[ChatMessage], rendering: ChatRendering,
                        tools: Optional[list[dict]] = None) -> tuple[str, list[int]]:
    """The chat rendered by its template, and its token ids."""
    text = await run_in_threadpool(render_chat, tokenizer, messages, rendering, tools)
    return text, await tokenize_text(tokenizer, text, add_special_tokens=False)
