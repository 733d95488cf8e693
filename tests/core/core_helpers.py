"""Helpers for the core tests: build a small scheduler and drive it with a fake runner.

A plain module (not conftest.py) with a unique name, so `from core_helpers import ...` cannot pick up another
test folder's helpers.
"""

from jaxpaged.config import CacheConfig, SchedulerConfig
from jaxpaged.core import Request, Scheduler, SchedulerOutput


def build_scheduler(*, num_kv_blocks: int = 64, block_size: int = 4, enable_prefix_caching: bool = True,
                    prefix_caching_granularity: str = "token", max_spec_tokens_per_step: int = 0,
                    **scheduler_options) -> Scheduler:
    """A scheduler with tiny blocks (4 tokens) unless told otherwise."""
    scheduler_options.setdefault("max_num_seqs", 8)
    scheduler_options.setdefault("max_num_batched_tokens", 64)
    scheduler_options.setdefault("max_model_len", 128)
    return Scheduler(SchedulerConfig(**scheduler_options),
                     CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                                 prefix_caching_granularity=prefix_caching_granularity),  # type: ignore[arg-type]
                     num_kv_blocks, max_spec_tokens_per_step=max_spec_tokens_per_step)


def run_step(scheduler: Scheduler, sampled_token_id: int = 7) -> SchedulerOutput:
    """schedule(), then every sampling request receives sampled_token_id."""
    output = scheduler.schedule()
    scheduler.update_from_output(output, [sampled_token_id] * output.num_sampled_requests)
    return output


def chunk_lens(output: SchedulerOutput) -> dict[str, int]:
    """request id -> how many tokens the step computes for it."""
    return {scheduled.request.request_id: len(scheduled.token_ids) for scheduled in output.scheduled}


def make_request(request_id: str, num_prompt_tokens: int, *, first_token: int = 1000, **options) -> Request:
    """A request whose prompt is first_token, first_token + 1, ... (distinct prompts get distinct ranges)."""
    return Request(request_id, list(range(first_token, first_token + num_prompt_tokens)), **options)

