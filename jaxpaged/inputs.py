"""Turning what a user passes as a prompt into token ids, with the checks that must happen on the host."""

import dataclasses
from typing import Optional, Union

from jaxpaged.checks import is_int

PromptInput = Union[str, list[int], dict]


@dataclasses.dataclass
class ParsedPrompt:
    """A validated prompt."""

    text: Optional[str]
    """The prompt text, None when it came as token ids."""
    token_ids: list[int]
    cache_salt: Optional[str] = None
    """Requests with different salts never share prefix-cache blocks."""
    priority: int = 0
    """Lower runs first under the "priority" scheduling policy."""


def parse_prompt(prompt: PromptInput, tokenizer, vocab_size: int) -> ParsedPrompt:
    """Tokenize or check a prompt; ValueError naming the field for anything the device must never see."""
    cache_salt, priority = None, 0
    if isinstance(prompt, dict):
        unknown = set(prompt) - {"prompt", "prompt_token_ids", "cache_salt", "priority"}
        if unknown:
            raise ValueError(f"prompt: unknown keys {sorted(unknown)}")
        if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
            raise ValueError("prompt: give exactly one of 'prompt' and 'prompt_token_ids'")
        cache_salt, priority = prompt.get("cache_salt"), prompt.get("priority", 0)
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt: must be a string, got {type(cache_salt).__name__}")
        if not is_int(priority):
            raise ValueError(f"priority: must be an int, got {priority!r}")
        prompt = prompt.get("prompt", prompt.get("prompt_token_ids"))
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: must not be empty")
        return ParsedPrompt(prompt, tokenizer.encode(prompt), cache_salt, priority)
    if isinstance(prompt, (list, tuple)):
        token_ids = list(prompt)
        if not token_ids:
            raise ValueError("prompt_token_ids: must not be empty")
        for token_id in token_ids:
            # NOTE: JAX clamps out-of-range gathers silently, so a bad id would embed the wrong token.
            if not is_int(token_id) or not 0 <= token_id < vocab_size:
                raise ValueError(f"prompt_token_ids: every id must be an int in [0, {vocab_size}), got {token_id!r}")
        return ParsedPrompt(None, token_ids, cache_salt, priority)
    raise ValueError(f"prompt: expected a string, a list of token ids or a dict, got {type(prompt).__name__}")
