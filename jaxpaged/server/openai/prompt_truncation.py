"""vLLM's `truncate_prompt_tokens` request key: keep only the prompt's last k tokens (-1: the last max_model_len).

Left truncation, as vLLM does it: the end of a prompt (the question, the assistant header) is what the output
continues. The truncated prompt carries no text (its decoded text would not be the request's), so echo returns the
tokens that were run.
"""

import dataclasses
from typing import Any, Optional

from jaxpaged.checks import is_int
from jaxpaged.inputs import ParsedPrompt
from jaxpaged.server.http.errors import APIError

KEY = "truncate_prompt_tokens"


def requested_truncation(payload: Any) -> Optional[int]:
    """The request's truncate_prompt_tokens (None: absent or null); 400 naming it unless an int >= 1 or -1."""
    value = payload.get(KEY) if isinstance(payload, dict) else None
    if value is None:
        return None
    if not is_int(value) or not (value >= 1 or value == -1):
        raise APIError(400, f"{KEY}: must be an int >= 1 (keep the prompt's last k tokens) or -1 (the last "
                            f"max_model_len), got {value!r}", param=KEY, code="invalid_value")
    return value


def truncated(prompt: ParsedPrompt, keep: Optional[int], max_model_len: int) -> ParsedPrompt:
    """`prompt` with only its last `keep` tokens (-1: max_model_len; None: unchanged)."""
    if keep is None:
        return prompt
    limit = max_model_len if keep == -1 else keep
    if len(prompt.token_ids) <= limit:
        return prompt
    return dataclasses.replace(prompt, token_ids=list(prompt.token_ids[-limit:]), text=None)
