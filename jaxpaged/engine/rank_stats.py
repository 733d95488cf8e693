"""The engine's stats snapshot from its data-parallel ranks' schedulers: gauges averaged or summed over the ranks,
speculative decoding's counters, and which LoRA adapters running and waiting requests use."""

from collections.abc import Sequence
from typing import Optional

from jaxpaged.core.request import RequestStatus
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.engine.stats import EngineStats
from jaxpaged.runner import compile_counter


def collect_stats(schedulers: Sequence[Scheduler], *, prompt_tokens_total: int, generation_tokens_total: int,
                  num_steps: int, warmup_seconds: float, max_loras: Optional[int]) -> EngineStats:
    """One snapshot over every rank; `max_loras` None: LoRA is off (no adapter fields)."""
    per_rank = [scheduler.stats() for scheduler in schedulers]
    total = lambda field: sum(getattr(stats, field) for stats in per_rank)
    stats = EngineStats(
        num_running=total("num_running"), num_waiting=total("num_waiting"),
        kv_cache_usage=total("kv_cache_usage") / len(per_rank),
        prefix_cache_queries=total("prefix_cache_queries"), prefix_cache_hits=total("prefix_cache_hits"),
        num_preemptions=total("num_preemptions"), num_compilations=compile_counter.num_compilations(),
        prompt_tokens_total=prompt_tokens_total, generation_tokens_total=generation_tokens_total,
        num_steps=num_steps, warmup_seconds=warmup_seconds)
    (stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens, stats.spec_decode_num_accepted_tokens,
     stats.spec_decode_num_accepted_tokens_per_pos) = _spec_decode_totals(schedulers)
    if max_loras is not None:
        _add_lora_usage(stats, schedulers, max_loras)
    return stats


def _add_lora_usage(stats: EngineStats, schedulers: Sequence[Scheduler], max_loras: int) -> None:
    """Which adapters running and waiting requests use (vllm:lora_requests_info)."""
    running: dict[str, None] = {}
    waiting: dict[str, None] = {}
    for scheduler in schedulers:
        for request in scheduler.requests.values():
            if request.lora_name is not None:
                (running if request.status is RequestStatus.RUNNING else waiting)[request.lora_name] = None
    stats.max_lora = max_loras
    stats.running_lora_adapters, stats.waiting_lora_adapters = list(running), list(waiting)


def _spec_decode_totals(schedulers: Sequence[Scheduler]) -> tuple[int, int, int, list[int]]:
    """Speculative decoding's counters summed over the data-parallel ranks."""
    per_position: list[int] = []
    drafts = draft_tokens = accepted = 0
    for scheduler in schedulers:
        spec = scheduler.spec_stats
        drafts, draft_tokens, accepted = drafts + spec.num_drafts, draft_tokens + spec.num_draft_tokens, \
            accepted + spec.num_accepted_tokens
        per_position += [0] * (len(spec.accepted_per_position) - len(per_position))
        for position, count in enumerate(spec.accepted_per_position):
            per_position[position] += count
    return drafts, draft_tokens, accepted, per_position
