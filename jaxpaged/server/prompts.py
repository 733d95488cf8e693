"""Turns request prompts (text, token ids, chat messages) into checked token ids for the engine.

The server tokenizes, so every length and vocabulary check happens here, before the engine sees the request.
Tokenizing runs in a worker thread: a 2 MiB prompt must not stall the event loop that streams other requests.
"""

import dataclasses
from typing import Any, Optional

from starlette.concurrency import run_in_threadpool

from jaxpaged.server.errors import APIError
from jaxpaged.server.protocol import ChatMessage, CompletionRequest
from jaxpaged.server.validation import check_token_ids


@dataclasses.dataclass
class PromptInput:
    """One prompt, tokenized and checked."""

    token_ids: list[int]
    """What the engine runs."""
    text: Optional[str]
    """The prompt's text when it came as text (echo uses it)."""


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


async def tokenize_text(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of a text, computed off the event loop."""
    return await run_in_threadpool(_encode, tokenizer, text, add_special_tokens)


async def completion_prompts(request: CompletionRequest, tokenizer: Any, vocab_size: int) -> list[PromptInput]:
    """The prompts of a completion request (one, or a batch); 400 for an empty one or out-of-vocabulary ids."""
    prompt = request.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        items = [prompt]
    else:
        items = list(prompt)
    if not items:
        raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
    prompts = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
            prompts.append(PromptInput(await tokenize_text(tokenizer, item), item))
        else:
            if not item:
                raise APIError(400, "prompt: must not be empty", param="prompt", code="invalid_value")
            check_token_ids(item, vocab_size, "prompt")
            prompts.append(PromptInput(list(item), None))
    return prompts


def _message_dict(message: ChatMessage) -> dict:
    if message.content is None:
        content = ""
    elif isinstance(message.content, str):
        content = message.content
    else:
        content = "\n".join(part.text for part in message.content)
    rendered = {"role": message.role, "content": content}
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


def render_chat(tokenizer: Any, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    """The conversation rendered by the model's chat template; 400 if the template rejects it."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise APIError(400, "messages: this model has no chat template; use /v1/completions", param="messages",
                       code="invalid_value")
    try:
        return tokenizer.apply_chat_template([_message_dict(m) for m in messages], tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as error:  # jinja TemplateError and friends: the template refused these messages
        raise APIError(400, f"messages: the chat template rejected them ({type(error).__name__})",
                       param="messages", code="invalid_value") from None


async def chat_prompt(tokenizer: Any, messages: list[ChatMessage], add_generation_prompt: bool) -> PromptInput:
    """Rendered and tokenized chat prompt (the template already holds the special tokens)."""
    text = await run_in_threadpool(render_chat, tokenizer, messages, add_generation_prompt)
    return PromptInput(await tokenize_text(tokenizer, text, add_special_tokens=False), text)
