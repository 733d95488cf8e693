"""Offline mode: the workload through jaxpaged.LLM.generate, timed by a StepProbe.

Every request of a round arrives when generate() is called; a multi-turn workload runs one generate() per round
(turn), so a turn can reuse the blocks its previous turn left in the prefix cache.
"""

import time
from typing import Optional

from jaxpaged.bench.bench_config import ModeConfig, SamplingConfig
from jaxpaged.bench.latency_stats import RequestTiming, run_metrics
from jaxpaged.bench.step_probe import StepProbe
from jaxpaged.bench.workloads import BenchRequest, group_by_turn


def build_llm(model: Optional[str], engine_options: dict):
    """Load the model and compile every bucket; returns (LLM, seconds the whole start took)."""
    from jaxpaged.llm import LLM

    start = time.perf_counter()
    llm = LLM(model, **engine_options)
    return llm, time.perf_counter() - start


def _sampling_params(request: BenchRequest, sampling: SamplingConfig, max_tokens: Optional[int] = None):
    from jaxpaged.sampling.params import SamplingParams

    return SamplingParams(temperature=sampling.temperature, ignore_eos=sampling.ignore_eos,
                          max_tokens=max_tokens or request.max_tokens)


def _reset_prefix_cache(engine) -> None:
    # NOTE: a repeat must not hit the blocks its previous repeat left behind, or run 2 of a workload is all hits.
    if not engine.reset_prefix_cache():
        raise RuntimeError("the engine still holds KV blocks between runs; cannot reset the prefix cache")


def warm_up_llm(llm, requests: list[BenchRequest], sampling: SamplingConfig, num_requests: int) -> None:
    """A few short unmeasured requests, so the measured run starts on warm host paths."""
    if num_requests > 0:
        batch = requests[:num_requests]
        llm.generate([{"prompt_token_ids": list(r.prompt_token_ids)} for r in batch],
                     [_sampling_params(r, sampling, max_tokens=2) for r in batch], use_tqdm=False)
    _reset_prefix_cache(llm.engine)


def run_offline(llm, requests: list[BenchRequest], sampling: SamplingConfig, mode: ModeConfig,
                tokens_out: Optional[list] = None) -> dict:
    """One measured run of the workload; the metrics of the run. `tokens_out`, when given, receives each request's
    output token ids in request order (a peer's greedy tokens are compared with them)."""
    engine = llm.engine
    _reset_prefix_cache(engine)
    before = engine.get_stats()
    timings: list[RequestTiming] = []
    later_timings: list[RequestTiming] = []  # rounds after the first (follow-up turns, revisits)
    tokens_by_request: dict[int, list[int]] = {}
    with StepProbe(engine, track_kv_utilization=mode.track_kv_utilization) as probe:
        start = time.time()
        for round_indices in group_by_turn(requests):
            batch = [requests[i] for i in round_indices]
            outputs = llm.generate([{"prompt_token_ids": list(r.prompt_token_ids)} for r in batch],
                                   [_sampling_params(r, sampling) for r in batch], use_tqdm=False)
            for index, request, output in zip(round_indices, batch, outputs):
                tokens_by_request[index] = list(output.outputs[0].token_ids)
                metrics = output.metrics
                (later_timings if request.turn > 0 else timings).append(RequestTiming(
                    arrival=metrics.arrival_time, first_token=metrics.first_token_time, finish=metrics.finish_time,
                    num_prompt_tokens=len(request.prompt_token_ids),
                    num_output_tokens=sum(len(sample.token_ids) for sample in output.outputs),
                    token_times=list(probe.token_times.get(output.request_id, []))))
        duration_s = time.time() - start
    after = engine.get_stats()
    if tokens_out is not None:
        tokens_out[:] = [tokens_by_request[index] for index in range(len(requests))]
    result = run_metrics(timings + later_timings, duration_s)
    if later_timings:
        result["ttft_ms_p50_after_round_1"] = run_metrics(later_timings, duration_s)["ttft_ms_p50"]
    result.update(probe.host_metrics())
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    result.update({
        "peak_kv_usage": probe.peak_kv_usage,
        "prefix_cache_hit_rate": (after.prefix_cache_hits - before.prefix_cache_hits) / queries if queries else 0.0,
        "prefix_cache_missed_reusable_rate": ((after.prefix_cache_missed_reusable_tokens
                                               - before.prefix_cache_missed_reusable_tokens) / queries
                                              if queries else 0.0),
        "num_preemptions": after.num_preemptions - before.num_preemptions,
        "num_compilations_measured": after.num_compilations - before.num_compilations,
        **_spec_decode_metrics(before, after),
        "warmup_s": engine.warmup_seconds,
    })
    result.update(_tier_metrics(before, after, queries))
    if mode.track_kv_utilization:
        result.update(probe.kv_metrics())
    return result


def _spec_decode_metrics(before, after) -> dict:
    """Speculative decoding in the run: proposed and accepted tokens, their ratio, and the tokens a verified row
    appended on average ({} when nothing was proposed)."""
    drafts = after.spec_decode_num_drafts - before.spec_decode_num_drafts
    if not drafts:
        return {}
    proposed = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    return {"spec_draft_tokens": proposed, "spec_accepted_tokens": accepted,
            "spec_acceptance_rate": accepted / proposed, "spec_mean_accepted_length": 1 + accepted / drafts}


def _tier_metrics(before, after, num_queried_tokens: int) -> dict:
    """Per KV tier, the share of looked-up prompt tokens it served; bytes loaded from and offloaded to the tiers
    below the device ({} while they are off)."""
    metrics = {}
    for name, tier in after.kv_tiers.items():
        hits = tier.hit_tokens - before.kv_tiers[name].hit_tokens
        metrics[f"{name}_tier_hit_rate"] = hits / num_queried_tokens if num_queried_tokens else 0.0
    if "device" in after.kv_tiers:
        device_before, device_after = before.kv_tiers["device"], after.kv_tiers["device"]
        metrics["tier_bytes_offloaded"] = device_after.bytes_out - device_before.bytes_out
        metrics["tier_bytes_loaded"] = device_after.bytes_in - device_before.bytes_in
    return metrics
