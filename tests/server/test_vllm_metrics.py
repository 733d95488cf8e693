"""vllm:* gauges and counters carry the engine's snapshot under vLLM's names with a model_name label (no server)."""

from typing import Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jaxpaged.engine.stats import EngineStats
from jaxpaged.server.vllm.metrics import VllmStatsCollector


class _EngineWithStats:
    """The one method the collector reads."""

    def __init__(self, stats: Optional[EngineStats]) -> None:
        self._stats = stats

    def get_stats(self) -> Optional[EngineStats]:
        return self._stats


def test_every_vllm_gauge_and_counter_is_its_engine_number_with_the_model_name():
    """Distinct numbers per field, so a name wired to the wrong field fails."""
    stats = EngineStats(num_running=3, num_waiting=5, kv_cache_usage=0.25, prefix_cache_queries=70,
                        prefix_cache_hits=40, num_preemptions=2, num_compilations=9, prompt_tokens_total=110,
                        generation_tokens_total=130, num_steps=17, warmup_seconds=1.5, spec_decode_num_drafts=11,
                        spec_decode_num_draft_tokens=44, spec_decode_num_accepted_tokens=23,
                        spec_decode_num_accepted_tokens_per_pos=[10, 8, 5])
    registry = CollectorRegistry()
    registry.register(VllmStatsCollector(_EngineWithStats(stats), "served-name"))  # type: ignore[arg-type]
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(generate_latest(registry).decode())
               for sample in family.samples}
    label = (("engine", "0"), ("model_name", "served-name"))
    expected = {"vllm:num_requests_running": 3, "vllm:num_requests_waiting": 5, "vllm:kv_cache_usage_perc": 0.25,
                "vllm:prefix_cache_queries_total": 70, "vllm:prefix_cache_hits_total": 40,
                "vllm:num_preemptions_total": 2, "vllm:prompt_tokens_total": 110,
                "vllm:generation_tokens_total": 130, "vllm:spec_decode_num_drafts_total": 11,
                "vllm:spec_decode_num_draft_tokens_total": 44, "vllm:spec_decode_num_accepted_tokens_total": 23}
    assert {name: samples[(name, label)] for name in expected} == expected
    per_position = {position: samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                       (("engine", "0"), ("model_name", "served-name"),
                                        ("position", str(position))))]
                    for position in range(3)}
    assert per_position == {0: 10, 1: 8, 2: 5}


def test_nothing_is_collected_before_the_engine_has_stats():
    registry = CollectorRegistry()
    registry.register(VllmStatsCollector(_EngineWithStats(None), "x"))  # type: ignore[arg-type]
    assert "vllm:" not in generate_latest(registry).decode()


def test_a_finished_request_s_phases_are_observed_from_its_engine_times():
    """Hand-worked: arrival 10.0, first scheduled 10.5, first token 11.0, finish 13.0 give queue 0.5, prefill 0.5,
    decode 2.0 and inference 2.5 s; a request aborted while waiting adds only its token count."""
    from jaxpaged.outputs import RequestMetrics
    from jaxpaged.server.vllm.metrics import VllmRequestMetrics

    registry = CollectorRegistry()
    buckets = {key: (1.0, 10.0) for key in ("ttft", "itl", "e2e", "tokens")}
    metrics = VllmRequestMetrics(registry, "m", buckets)
    metrics.observe_phases(RequestMetrics(10.0, first_scheduled_time=10.5, first_token_time=11.0, finish_time=13.0), 7)
    metrics.observe_phases(RequestMetrics(20.0), 0)
    sums = {sample.name: sample.value for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples if sample.name.endswith(("_sum", "_count"))}
    assert {name: sums[f"vllm:request_{name}_seconds_sum"] for name in ("queue_time", "prefill_time", "decode_time",
                                                                        "inference_time")} == {
        "queue_time": 0.5, "prefill_time": 0.5, "decode_time": 2.0, "inference_time": 2.5}
    assert sums["vllm:request_queue_time_seconds_count"] == 1
    assert (sums["vllm:request_max_num_generation_tokens_count"], sums["vllm:request_max_num_generation_tokens_sum"]) \
        == (2, 7)
