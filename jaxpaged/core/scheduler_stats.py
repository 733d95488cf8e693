"""SchedulerStats: a snapshot of the scheduler for /metrics and logs."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class SchedulerStats:
    """Gauges of the moment and cumulative counters (counters count tokens, or events for preemptions)."""

    num_running: int
    """Requests holding KV blocks."""
    num_waiting: int
    """Requests queued for admission (new or preempted)."""
    kv_cache_usage: float
    """Fraction of usable KV blocks held by requests, 0.0 to 1.0."""
    num_preemptions: int
    """Preemptions since start."""
    prefix_cache_queries: int
    """Tokens of admitted requests looked up in the prefix cache since start."""
    prefix_cache_hits: int
    """Of those, tokens served from the prefix cache."""
