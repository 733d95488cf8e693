"""EngineStats: the numbers /metrics and the benchmarks read."""

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # filled by the KV tiers feature when it is on; the engine never imports it
    from jaxpaged.kv_tiers.tier_stats import TierStats


@dataclasses.dataclass
class EngineStats:
    """A snapshot of the engine's gauges and cumulative counters."""

    num_running: int
    """Requests (samples) scheduled in the running set."""
    num_waiting: int
    """Requests (samples) waiting or preempted."""
    kv_cache_usage: float
    """Fraction of KV blocks (null block excluded) referenced by requests, 0..1 (mean over data-parallel ranks)."""
    prefix_cache_queries: int
    """Prompt tokens looked up in the prefix cache (cumulative)."""
    prefix_cache_hits: int
    """Prompt tokens found there (cumulative)."""
    num_preemptions: int
    """Recompute preemptions (cumulative)."""
    num_compilations: int
    """XLA compilations in this process (cumulative); flat after warm-up."""
    prompt_tokens_total: int
    """Prompt tokens of added requests (cumulative)."""
    generation_tokens_total: int
    """Sampled tokens (cumulative)."""
    num_steps: int
    """Engine steps run (cumulative)."""
    warmup_seconds: float
    """Time the start-up compilation of every bucket took."""
    prefix_cache_missed_reusable_tokens: int = 0
    """Prompt tokens recomputed although their content was seen before, after the prompt diverged (cumulative;
    core/prefix_advisor.py)."""
    spec_decode_num_drafts: int = 0
    """Speculative decoding: rows that verified proposals (cumulative; vLLM's spec_decode_num_drafts)."""
    spec_decode_num_draft_tokens: int = 0
    """Proposed tokens verified (cumulative)."""
    spec_decode_num_accepted_tokens: int = 0
    """Proposed tokens accepted (cumulative)."""
    spec_decode_num_accepted_tokens_per_pos: list[int] = dataclasses.field(default_factory=list)
    """Per proposal position (0 = the first proposed token): rows that accepted it (cumulative)."""
    max_lora: int = 0
    """LoRA adapters one step may hold (enable_lora's max_loras); 0 when LoRA is off."""
    running_lora_adapters: list[str] = dataclasses.field(default_factory=list)
    """Names of the LoRA adapters of running requests (vLLM's vllm:lora_requests_info label)."""
    waiting_lora_adapters: list[str] = dataclasses.field(default_factory=list)
    """Names of the LoRA adapters of waiting requests."""
    kv_tiers: dict[str, "TierStats"] = dataclasses.field(default_factory=dict)
    """Per KV tier while the tiers below the device are on ("device", then "host" and "disk" when on): hits, bytes
    moved, usage. Empty when they are off."""
