"""The checks a request passes before the scheduler queues it: anything that could never run is refused at once,
with a ValueError naming the field, and nothing changes."""

from collections.abc import Callable, Mapping
from typing import Optional

from .request import Request, RequestStatus


def validate_new_request(request: Request, requests: Mapping[str, Request], max_model_len: int, block_size: int,
                         num_usable_blocks: int, blocks_for_tokens: Optional[Callable[[int], int]] = None) -> None:
    """Refuse a request that is not new, repeats an id in `requests`, or could never fit max_model_len or the whole
    pool of num_usable_blocks blocks (`blocks_for_tokens`: the most blocks a request of so many tokens holds, when
    KV layer groups keep only a window; every block of every token when None)."""
    if not isinstance(request, Request):
        raise ValueError(f"request: must be a jaxpaged.core.Request, got {type(request).__name__}")
    if request.request_id in requests:
        raise ValueError(f"request_id: {request.request_id!r} is already in the scheduler")
    if request.status is not RequestStatus.WAITING or request.num_computed_tokens or request.output_token_ids:
        raise ValueError(f"request: must be new (WAITING, nothing computed or generated), got {request!r}")
    num_prompt_tokens = len(request.prompt_token_ids)
    if num_prompt_tokens > max_model_len:
        raise ValueError(f"prompt_token_ids: {num_prompt_tokens} tokens exceed max_model_len ({max_model_len})")
    if not isinstance(request.max_tokens, int) or request.max_tokens < 1:
        raise ValueError(f"max_tokens: must be an int >= 1, got {request.max_tokens!r}")
    # The last generated token's K/V is never computed; a prompt of exactly max_model_len still samples one.
    max_kv_tokens = max(num_prompt_tokens, min(num_prompt_tokens + request.max_tokens, max_model_len) - 1)
    count = blocks_for_tokens or (lambda num_tokens: -(-num_tokens // block_size))
    max_blocks = count(max_kv_tokens)
    if max_blocks > num_usable_blocks:
        prompt_blocks = count(num_prompt_tokens)
        field = "prompt_token_ids" if prompt_blocks > num_usable_blocks else "max_tokens"
        raise ValueError(f"{field}: prompt ({num_prompt_tokens} tokens) + max_tokens ({request.max_tokens}) "
                         f"can need {max_blocks} KV blocks, but the whole pool has {num_usable_blocks}")
