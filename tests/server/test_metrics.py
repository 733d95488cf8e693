"""/metrics: Prometheus text that parses, with engine gauges and counters and latency histograms that move."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.xdist_group("server")


def _scrape(base_url: str) -> dict[str, float]:
    """Every sample of the scrape, keyed by its name (and labels, when it has any)."""
    response = httpx.get(base_url + "/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_metrics_parse_and_move(server, client, model_name):
    """One request moves the token counters by its usage and adds one TTFT/e2e observation, n-1 ITL ones."""
    before = _scrape(server.base_url)
    for name in ("jaxpaged_num_requests_running", "jaxpaged_num_requests_waiting", "jaxpaged_kv_cache_usage_perc"):
        assert before[name] == 0.0
    assert before["jaxpaged_engine_loop_alive"] == 1.0
    assert before["jaxpaged_xla_compilations_total"] > 0
    result = client.completions.create(model=model_name, prompt="Metrics are", max_tokens=7,
                                       extra_body={"ignore_eos": True})
    after = _scrape(server.base_url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("jaxpaged_prompt_tokens_total") == result.usage.prompt_tokens
    assert delta("jaxpaged_generation_tokens_total") == 7
    assert delta("jaxpaged_prefix_cache_queries_total") >= result.usage.prompt_tokens - 1
    assert delta("jaxpaged_prefix_cache_hits_total") >= 0
    assert delta("jaxpaged_time_to_first_token_seconds_count") == 1
    assert delta("jaxpaged_e2e_request_latency_seconds_count") == 1
    assert delta("jaxpaged_inter_token_latency_seconds_count") == 6
    assert delta("jaxpaged_e2e_request_latency_seconds_sum") > 0
    assert delta("jaxpaged_sequences_finished_total{finish_reason=length}") == 1
    assert delta("jaxpaged_xla_compilations_total") == 0  # warm-up compiled every shape already
    assert after["jaxpaged_num_preemptions_total"] >= 0
    # vLLM's dashboard panels: the request's phases (one observation each), its longest sample, and the http_*
    # and process_* series.
    vllm = f"engine=0,model_name={model_name}"
    for phase in ("queue_time", "prefill_time", "decode_time", "inference_time"):
        assert delta(f"vllm:request_{phase}_seconds_count{{{vllm}}}") == 1, phase
    assert delta(f"vllm:request_max_num_generation_tokens_sum{{{vllm}}}") == 7
    assert delta(f"vllm:request_inference_time_seconds_sum{{{vllm}}}") <= delta(
        f"vllm:e2e_request_latency_seconds_sum{{{vllm}}}") + 1e-3
    assert delta("http_requests_total{handler=/v1/completions,method=POST,status=2xx}") == 1
    assert after["process_resident_memory_bytes"] > 0


def test_rejections_are_counted(overload_server):
    """A refused request shows up in jaxpaged_requests_rejected_total{reason=overloaded}."""
    before = _scrape(overload_server.base_url).get("jaxpaged_requests_rejected_total{reason=overloaded}", 0.0)
    response = httpx.post(overload_server.base_url + "/v1/completions", json={"prompt": ["hi"] * 33,
                                                                             "max_tokens": 1})
    assert response.status_code == 429
    after = _scrape(overload_server.base_url)["jaxpaged_requests_rejected_total{reason=overloaded}"]
    assert after == before + 1


def test_apps_have_their_own_registries(server, overload_server, model_name):
    """Two apps on one engine: the same engine counters, but a request shows only in its own app's histograms."""
    name = "jaxpaged_e2e_request_latency_seconds_count"
    plain_before, other_before = _scrape(server.base_url), _scrape(overload_server.base_url)
    response = httpx.post(overload_server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert response.status_code == 200
    plain_after, other_after = _scrape(server.base_url), _scrape(overload_server.base_url)
    assert other_after[name] == other_before.get(name, 0.0) + 1
    assert plain_after.get(name, 0.0) == plain_before.get(name, 0.0)
    assert plain_after["jaxpaged_prompt_tokens_total"] == other_after["jaxpaged_prompt_tokens_total"]
