"""The contiguous-reservation baseline of the KV utilization sweep, computed from the same trace.

A server without paging reserves one contiguous KV region per request when it admits it: either max_model_len
slots ("max_model_len", the classic static allocation) or exactly prompt + max_tokens ("request", the best a
contiguous allocator can do when it knows every output length in advance). The simulation admits requests
first-come first-served while their reservation fits the same token capacity as the paged pool, then steps: the
admitting step computes the prompt, each later step one more token, and a request leaves after its last token.
It models memory only (no token budget, no chunked prefill), which favours the baseline.

Utilization is live tokens over reserved slots, summed over steps: the same definition the paged run reports
(live tokens over allocated block capacity, sampled after every schedule()).
"""

import collections
import dataclasses
from collections.abc import Sequence

RESERVATIONS = ("max_model_len", "request")


@dataclasses.dataclass(frozen=True)
class BaselineResult:
    """What a contiguous allocator achieves on the trace."""

    reservation: str
    """"max_model_len" or "request"."""
    max_concurrent_requests: int
    kv_utilization_mean: float
    """Sum over steps of live tokens / sum over steps of reserved slots."""
    num_steps: int


def contiguous_baseline(prompt_lens: Sequence[int], output_lens: Sequence[int], capacity_tokens: int,
                        max_model_len: int, max_num_seqs: int, reservation: str) -> BaselineResult:
    """Simulate FCFS admission with contiguous per-request reservations over a trace."""
    if reservation not in RESERVATIONS:
        raise ValueError(f"reservation: must be one of {RESERVATIONS}, got {reservation!r}")
    if len(prompt_lens) != len(output_lens):
        raise ValueError(f"output_lens: {len(output_lens)} lengths for {len(prompt_lens)} prompts")
    for prompt_len, output_len in zip(prompt_lens, output_lens):
        if prompt_len < 1 or output_len < 1:
            raise ValueError(f"prompt_lens/output_lens: must be >= 1, got {prompt_len}/{output_len}")
        if prompt_len + output_len > max_model_len:
            raise ValueError(f"prompt_lens: {prompt_len} + {output_len} exceeds max_model_len ({max_model_len})")
    reserve = [max_model_len if reservation == "max_model_len" else p + o for p, o in zip(prompt_lens, output_lens)]
    if max(reserve, default=0) > capacity_tokens:
        raise ValueError(f"capacity_tokens: {capacity_tokens} cannot hold one reservation of {max(reserve)} slots")
    waiting = collections.deque(range(len(prompt_lens)))
    running: dict[int, int] = {}  # request -> steps it has run
    free = capacity_tokens
    total_live = total_reserved = 0
    max_concurrent = num_steps = 0
    while waiting or running:
        while waiting and len(running) < max_num_seqs and reserve[waiting[0]] <= free:
            request = waiting.popleft()
            running[request] = 0
            free -= reserve[request]
        max_concurrent = max(max_concurrent, len(running))
        for request in running:
            # computed tokens after this step's schedule: the prompt, plus one per earlier decode step
            total_live += prompt_lens[request] + running[request]
            total_reserved += reserve[request]
        num_steps += 1
        for request in list(running):
            running[request] += 1
            if running[request] == output_lens[request]:
                del running[request]
                free += reserve[request]
    return BaselineResult(reservation, max_concurrent, total_live / total_reserved if total_reserved else 0.0,
                          num_steps)
