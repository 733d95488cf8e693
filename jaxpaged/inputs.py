"""Prompts: what a user may pass (PromptInput) and the one checked form the engine runs (ParsedPrompt).

Every path into the engine ends in a ParsedPrompt: `LLM.generate` and `LLMEngine.add_request` parse user input
with `parse_prompt`; the server tokenizes itself and builds ParsedPrompt.from_token_ids. Both run the one
token-id check, `check_token_ids`, on the host: JAX clamps out-of-range gathers silently, so a bad id would
embed the wrong token instead of failing.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, Union

from jaxpaged.checks import is_int


def check_token_ids(token_ids: Sequence[Any], vocab_size: int, field: str) -> None:
    """ValueError naming `field` unless every id is an int in [0, vocab_size)."""
    for token_id in token_ids:
        if not is_int(token_id) or not 0 <= token_id < vocab_size:
            raise ValueError(f"{field}: every id must be an int in [0, {vocab_size}), got {token_id!r}")


@dataclasses.dataclass(frozen=True)
class ParsedPrompt:
    """A checked prompt: token ids in range, a string salt, an int priority. Build it with
    `parse_prompt` or `ParsedPrompt.from_token_ids`, which check; the engine trusts an instance."""

    text: Optional[str]
    """The prompt text, None when it came as token ids."""
    token_ids: list[int]
    cache_salt: Optional[str] = None
    """Requests with different salts never share prefix-cache blocks."""
    priority: int = 0
    """Lower runs first under the "priority" scheduling policy."""

    @classmethod
    def from_token_ids(cls, token_ids: Sequence[int], vocab_size: int, *, text: Optional[str] = None,
                       cache_salt: Optional[str] = None, priority: int = 0,
                       field: str = "prompt_token_ids") -> "ParsedPrompt":
        """Check and wrap already-tokenized input; ValueError naming `field` (or the option) when bad."""
        if len(token_ids) == 0:
            raise ValueError(f"{field}: must not be empty")
        check_token_ids(token_ids, vocab_size, field)
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt: must be a string, got {type(cache_salt).__name__}")
        if not is_int(priority):
            raise ValueError(f"priority: must be an int, got {priority!r}")
        return cls(text, list(token_ids), cache_salt, priority)


PromptInput = Union[str, list[int], dict, ParsedPrompt]
"""A text, token ids, a dict {"prompt" | "prompt_token_ids", "cache_salt", "priority"}, or a ParsedPrompt."""


def parse_prompt(prompt: PromptInput, tokenizer: Any, vocab_size: int) -> ParsedPrompt:
    """Tokenize or check a prompt; ValueError naming the field for anything the device must never see."""
    if isinstance(prompt, ParsedPrompt):
        return prompt
    cache_salt, priority = None, 0
    if isinstance(prompt, dict):
        unknown = set(prompt) - {"prompt", "prompt_token_ids", "cache_salt", "priority"}
        if unknown:
            raise ValueError(f"prompt: unknown keys {sorted(unknown)}")
        if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
            raise ValueError("prompt: give exactly one of 'prompt' and 'prompt_token_ids'")
        cache_salt, priority = prompt.get("cache_salt"), prompt.get("priority", 0)
        prompt = prompt["prompt"] if "prompt" in prompt else prompt["prompt_token_ids"]  # exactly one is there
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: must not be empty")
        return ParsedPrompt.from_token_ids(tokenizer.encode(prompt), vocab_size, text=prompt, cache_salt=cache_salt,
                                           priority=priority, field="prompt")
    if isinstance(prompt, (list, tuple)):
        return ParsedPrompt.from_token_ids(prompt, vocab_size, cache_salt=cache_salt, priority=priority)
    raise ValueError(f"prompt: expected a string, a list of token ids or a dict, got {type(prompt).__name__}")
