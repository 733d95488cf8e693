"""Turns request prompts (text, token ids, chat messages) into checked token ids for the engine.

The server tokenizes, so every length and vocabulary check happens here, before the engine sees the request.
Tokenizing runs in a worker thread: a 2 MiB prompt must not stall the event loop that streams other requests.
"""

from typing import Any, Optional, Union, cast

from starlette.concurrency import run_in_threadpool

from jaxpaged.inputs import ParsedPrompt
from jaxpaged.server.errors import APIError, from_value_error
from jaxpaged.server.protocol import ChatMessage, CompletionRequest, TokenId


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
    return rendered


def render_chat(tokenizer: Any, messages: list[ChatMessage], add_generation_prompt: bool,
                tools: Optional[list[dict]] = None) -> str:
    """The conversation rendered by the model's chat template; 400 if the template rejects it."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise APIError(400, "messages: this model has no chat template; use /v1/completions", param="messages",
                       code="invalid_value")
    try:
        return tokenizer.apply_chat_template([_message_dict(m) for m in messages], tokenize=False,
                                             add_generation_prompt=add_generation_prompt, tools=tools)
    except Exception as error:  # jinja TemplateError and friends: the template refused these messages
        raise APIError(400, f"messages: the chat template rejected them ({type(error).__name__})",
                       param="messages", code="invalid_value") from None


async def chat_prompt(tokenizer: Any, vocab_size: int, messages: list[ChatMessage], add_generation_prompt: bool, *,
                      cache_salt: Optional[str], priority: int, tools: Optional[list[dict]] = None) -> ParsedPrompt:
    """The engine prompt of a chat: rendered (with the tools, for templates that show them) and tokenized (the
    template already holds the special tokens)."""
    text, token_ids = await tokenize_chat(tokenizer, messages, add_generation_prompt, tools)
    return _engine_prompt(token_ids, vocab_size, text, cache_salt, priority)


async def tokenize_chat(tokenizer: Any, messages: list[ChatMessage], add_generation_prompt: bool,
                        tools: Optional[list[dict]] = None) -> tuple[str, list[int]]:
    """The chat rendered by its template, and its token ids."""
    text = await run_in_threadpool(render_chat, tokenizer, messages, add_generation_prompt, tools)
    return text, await tokenize_text(tokenizer, text, add_special_tokens=False)
