"""Prometheus metrics of one app, in its own CollectorRegistry (so tests and embedders can build several apps).

Engine-wide numbers (running, waiting, KV usage, prefix cache, preemptions, tokens, compilations) are read from
the engine loop's latest stats snapshot at scrape time; latency histograms are observed by the request handlers.
With a key set, /metrics needs it (http/auth.py): the prefix-cache counters tell a reader what other clients prompted.
"""

from collections.abc import Iterator
from typing import Any, Optional

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_fastapi_instrumentator import Instrumentator

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.server.vllm.metrics import (
    ENGINE_INDEX,
    ENGINE_LABEL,
    MODEL_LABEL,
    TOKEN_BUCKETS,
    VllmRequestMetrics,
    VllmStatsCollector,
)
from jaxpaged.server.vllm.metrics import PREFIX as VLLM_PREFIX

PREFIX = "jaxpaged_"

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

# (stats field, metric name without the prefix, help text); counters are cumulative in the engine already.
_GAUGES = (
    ("num_running", "num_requests_running", "Requests the engine is running (prefill or decode)."),
    ("num_waiting", "num_requests_waiting", "Requests waiting to be scheduled."),
    ("kv_cache_usage", "kv_cache_usage_perc", "Fraction of KV cache blocks in use by requests, 0..1."),
)
_COUNTERS = (
    ("prefix_cache_queries", "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    ("prefix_cache_hits", "prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    ("prefix_cache_missed_reusable_tokens", "prefix_cache_missed_reusable_tokens",
     "Prompt tokens recomputed although seen before, because the prompt diverged earlier (reorder to reuse)."),
    ("num_preemptions", "num_preemptions", "Requests preempted (their KV freed, to be recomputed)."),
    ("prompt_tokens_total", "prompt_tokens", "Prompt tokens processed (prefill)."),
    ("generation_tokens_total", "generation_tokens", "Tokens generated (decode)."),
    ("num_compilations", "xla_compilations", "XLA compilations of the engine's jitted functions."),
    ("spec_decode_num_draft_tokens", "spec_decode_draft_tokens", "Speculative decoding: proposed tokens verified."),
    ("spec_decode_num_accepted_tokens", "spec_decode_accepted_tokens",
     "Speculative decoding: proposed tokens accepted."),
)
# Per KV tier (label "tier": device, host, disk), while the tiers below the device are on.
_TIER_COUNTERS = (
    ("hit_tokens", "kv_tier_hit_tokens", "Prompt tokens served from this KV tier."),
    ("bytes_in", "kv_tier_bytes_in", "Bytes written into this KV tier (offloads, promotions)."),
    ("bytes_out", "kv_tier_bytes_out", "Bytes read out of this KV tier towards the device."),
    ("corrupt_entries", "kv_tier_corrupt_entries", "Entries that failed their checksum and were dropped as misses."),
)
_TIER_GAUGES = (
    ("bytes_used", "kv_tier_bytes_used", "Bytes this KV tier holds."),
    ("capacity_bytes", "kv_tier_capacity_bytes", "The bound of this KV tier in bytes."),
    ("num_blocks", "kv_tier_blocks", "Cached KV blocks this tier holds."),
)


class _EngineStatsCollector(Collector):
    """Turns the engine's latest stats snapshot into gauges and counters at each scrape."""

    def __init__(self, engine: AsyncLLMEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        alive = GaugeMetricFamily(PREFIX + "engine_loop_alive", "1 while the engine loop thread runs.")
        alive.add_metric([], 1.0 if self._engine.is_alive else 0.0)
        yield alive
        stats = self._engine.get_stats()
        if stats is None:
            return
        for fields, family in ((_GAUGES, GaugeMetricFamily), (_COUNTERS, CounterMetricFamily)):
            for field, name, documentation in fields:
                metric = family(PREFIX + name, documentation)
                metric.add_metric([], float(getattr(stats, field)))
                yield metric
        if stats.kv_tiers:
            for fields, family in ((_TIER_COUNTERS, CounterMetricFamily), (_TIER_GAUGES, GaugeMetricFamily)):
                for field, name, documentation in fields:
                    metric = family(PREFIX + name, documentation, labels=["tier"])
                    for tier, tier_stats in stats.kv_tiers.items():
                        metric.add_metric([tier], float(getattr(tier_stats, field)))
                    yield metric


class _Both:
    """A jaxpaged metric and its vLLM twin, observed (or counted) together."""

    def __init__(self, own: Any, vllm: Any) -> None:
        self._own, self._vllm = own, vllm

    def observe(self, value: float) -> None:
        self._own.observe(value)
        self._vllm.observe(value)

    def inc(self, amount: float = 1) -> None:
        self._own.inc(amount)
        self._vllm.inc(amount)


class _FinishCounter:
    """jaxpaged_sequences_finished{finish_reason} with vllm:request_success{model_name, finished_reason}."""

    def __init__(self, own: Counter, vllm: VllmRequestMetrics) -> None:
        self._own, self._vllm = own, vllm

    def labels(self, finish_reason: str) -> _Both:
        return _Both(self._own.labels(finish_reason), self._vllm.request_success(finish_reason))


def register_cache_config_info(registry: CollectorRegistry, engine: AsyncLLMEngine, model_name: str) -> None:
    """How the KV cache is laid out, as info gauges (value 1, the facts in labels): jaxpaged_cache_config_info and
    vLLM's vllm:cache_config_info (its label names: cache_dtype, num_gpu_blocks), so a dashboard can tell an int8 KV
    server's token capacity from a bfloat16 one's."""
    config, runner = engine.engine.config, engine.engine.runner
    block_size, num_blocks = str(config.cache.block_size), str(runner.num_kv_blocks)
    Gauge(PREFIX + "cache_config_info", "The KV cache's format and size (labels; the value is 1).",
          ["kv_cache_dtype", "kv_format", "block_size", "num_kv_blocks", "kv_bytes_per_token"], registry=registry
          ).labels(config.cache.kv_cache_dtype, runner.memory_plan.kv_format, block_size, num_blocks,
                   str(runner.memory_plan.kv_bytes_per_token)).set(1)
    Gauge(VLLM_PREFIX + "cache_config_info", "Information of the LLMEngine CacheConfig.",
          [MODEL_LABEL, ENGINE_LABEL, "cache_dtype", "block_size", "num_gpu_blocks"], registry=registry
          ).labels(model_name, ENGINE_INDEX, config.cache.kv_cache_dtype, block_size, num_blocks).set(1)


class ServerMetrics:
    """One app's registry: engine stats plus request latency histograms and request counters, each under its
    jaxpaged_* name and, where vLLM has one, its vllm:* name labelled with `model_name`."""

    def __init__(self, engine: AsyncLLMEngine, model_name: Optional[str] = None) -> None:
        model_name = model_name or engine.model_name
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_* (CPU seconds, resident memory, open fds), as vLLM's
        self.registry.register(_EngineStatsCollector(engine))
        self.registry.register(VllmStatsCollector(engine, model_name))
        register_cache_config_info(self.registry, engine, model_name)
        vllm = VllmRequestMetrics(self.registry, model_name, {"ttft": _TTFT_BUCKETS, "itl": _ITL_BUCKETS,
                                                               "e2e": _E2E_BUCKETS, "tokens": TOKEN_BUCKETS})
        self.time_to_first_token = _Both(Histogram(
            PREFIX + "time_to_first_token_seconds", "Seconds from a request's arrival to its first token.",
            buckets=_TTFT_BUCKETS, registry=self.registry), vllm.time_to_first_token)
        self.inter_token_latency = _Both(Histogram(
            PREFIX + "inter_token_latency_seconds", "Seconds between successive tokens of one sequence.",
            buckets=_ITL_BUCKETS, registry=self.registry), vllm.inter_token_latency)
        self.e2e_request_latency = _Both(Histogram(
            PREFIX + "e2e_request_latency_seconds", "Seconds from a request's arrival to its last token.",
            buckets=_E2E_BUCKETS, registry=self.registry), vllm.e2e_request_latency)
        self.request_prompt_tokens = vllm.request_prompt_tokens
        """vLLM only: prompt tokens per finished engine request."""
        self.request_generation_tokens = vllm.request_generation_tokens
        """vLLM only: generated tokens per finished engine request (all its choices)."""
        self.request_phases = vllm
        """vLLM only: a finished request's queue, prefill, decode and inference times (observe_phases)."""
        self.sequences_finished = _FinishCounter(Counter(
            PREFIX + "sequences_finished", "Choices (sequences) that ended, by finish reason (abort: client gone).",
            ["finish_reason"], registry=self.registry), vllm)
        self.requests_rejected = Counter(
            PREFIX + "requests_rejected", "HTTP requests refused before reaching the engine, by reason.",
            ["reason"], registry=self.registry)

    def instrument_http(self, app: FastAPI) -> None:
        """vLLM's http_* series (prometheus-fastapi-instrumentator, as vLLM uses it): requests by handler, method
        and status, their latency and sizes, in this registry; /metrics itself is left out."""
        Instrumentator(excluded_handlers=["/metrics"], registry=self.registry).instrument(app)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
