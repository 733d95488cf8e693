"""vLLM's metric names (`vllm:*`, with a `model_name` label) beside jaxpaged's own, so vLLM's Grafana dashboards and
the Kubernetes Gateway API inference extension (which reads vllm:num_requests_waiting, vllm:kv_cache_usage_perc and
vllm:num_requests_running) work unchanged. Each one carries the same number as its jaxpaged_* counterpart."""

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.outputs import RequestMetrics

PREFIX = "vllm:"
MODEL_LABEL = "model_name"
ENGINE_LABEL, ENGINE_INDEX = "engine", "0"
"""vLLM V1 labels every series with its engine core's index; one engine loop serves every rank here."""

# (engine stats field, vLLM's name without the prefix, help text).
_GAUGES = (
    ("num_running", "num_requests_running", "Number of requests in model execution batches."),
    ("num_waiting", "num_requests_waiting", "Number of requests waiting to be processed."),
    ("kv_cache_usage", "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
_COUNTERS = (
    ("prompt_tokens_total", "prompt_tokens", "Number of prefill tokens processed."),
    ("generation_tokens_total", "generation_tokens", "Number of generation tokens processed."),
    ("num_preemptions", "num_preemptions", "Cumulative number of preemptions from the engine."),
    ("prefix_cache_queries", "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("spec_decode_num_drafts", "spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("spec_decode_num_draft_tokens", "spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("spec_decode_num_accepted_tokens", "spec_decode_num_accepted_tokens", "Number of accepted tokens."),
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class VllmStatsCollector(Collector):
    """The engine's latest stats snapshot under vLLM's gauge and counter names, at each scrape."""

    def __init__(self, engine: AsyncLLMEngine, model_name: str) -> None:
        self._engine, self._model_name = engine, model_name

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.get_stats()
        if stats is None:
            return
        for fields, family in ((_GAUGES, GaugeMetricFamily), (_COUNTERS, CounterMetricFamily)):
            for field, name, documentation in fields:
                metric = family(PREFIX + name, documentation, labels=[MODEL_LABEL, ENGINE_LABEL])
                metric.add_metric([self._model_name, ENGINE_INDEX], float(getattr(stats, field)))
                yield metric
        per_position = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                           "Accepted tokens per draft position.",
                                           labels=[MODEL_LABEL, ENGINE_LABEL, "position"])
        for position, count in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
            per_position.add_metric([self._model_name, ENGINE_INDEX, str(position)], float(count))
        yield per_position
        if stats.max_lora:
            # vLLM's labels and value: the adapters as comma-separated names, the sample's time as its value (the
            # gateway's adapter affinity reads the newest sample).
            lora = GaugeMetricFamily(PREFIX + "lora_requests_info", "Running stats on lora requests.",
                                     labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
            lora.add_metric([str(stats.max_lora), ",".join(stats.waiting_lora_adapters),
                             ",".join(stats.running_lora_adapters)], time.time())
            yield lora


class VllmRequestMetrics:
    """vLLM's per-request histograms and its request_success counter, bound to one model name."""

    def __init__(self, registry: CollectorRegistry, model_name: str, buckets: dict[str, tuple]) -> None:
        def histogram(name: str, documentation: str, bucket_key: str) -> Any:
            return Histogram(PREFIX + name, documentation, [MODEL_LABEL, ENGINE_LABEL], buckets=buckets[bucket_key],
                             registry=registry).labels(model_name, ENGINE_INDEX)

        self.time_to_first_token = histogram("time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", "ttft")
        self.inter_token_latency = histogram("inter_token_latency_seconds",
                                             "Histogram of inter-token latency in seconds.", "itl")
        self.e2e_request_latency = histogram("e2e_request_latency_seconds",
                                             "Histogram of e2e request latency in seconds.", "e2e")
        self.request_prompt_tokens = histogram("request_prompt_tokens",
                                               "Number of prefill tokens processed.", "tokens")
        self.request_generation_tokens = histogram("request_generation_tokens",
                                                   "Number of generation tokens processed.", "tokens")
        # The phases of a finished request (vLLM's dashboard panels "Queue Time", "Requests Prefill and Decode
        # Time" and "Max Generation Token in Sequence Group").
        self.request_queue_time = histogram("request_queue_time_seconds",
                                            "Histogram of time spent in WAITING phase for request.", "e2e")
        self.request_prefill_time = histogram("request_prefill_time_seconds",
                                              "Histogram of time spent in PREFILL phase for request.", "e2e")
        self.request_decode_time = histogram("request_decode_time_seconds",
                                             "Histogram of time spent in DECODE phase for request.", "e2e")
        self.request_inference_time = histogram("request_inference_time_seconds",
                                                "Histogram of time spent in RUNNING phase for request.", "e2e")
        self.request_max_num_generation_tokens = histogram(
            "request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            "tokens")
        self._success = Counter(PREFIX + "request_success", "Count of successfully processed requests.",
                                [MODEL_LABEL, ENGINE_LABEL, "finished_reason"], registry=registry)
        self._model_name = model_name

    def request_success(self, finished_reason: str) -> Any:
        """The counter child of one finish reason (stop, length, abort)."""
        return self._success.labels(self._model_name, ENGINE_INDEX, finished_reason)

    def observe_phases(self, times: RequestMetrics, max_generation_tokens: int) -> None:
        """A finished request's queue, prefill, decode and inference times (engine clock) and its longest
        sample's token count."""
        self.request_max_num_generation_tokens.observe(max_generation_tokens)
        if times.first_scheduled_time is None or times.finish_time is None:
            return  # aborted while waiting
        self.request_queue_time.observe(times.first_scheduled_time - times.arrival_time)
        self.request_inference_time.observe(times.finish_time - times.first_scheduled_time)
        if times.first_token_time is not None:
            self.request_prefill_time.observe(times.first_token_time - times.first_scheduled_time)
            self.request_decode_time.observe(times.finish_time - times.first_token_time)

