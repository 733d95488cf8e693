"""Online mode: drive a `jaxpaged serve` with streamed /v1/completions at a Poisson rate or a concurrency cap.

TTFT, ITL and E2E are measured by the client from the SSE stream (one delivery per chunk that carries a choice);
output tokens come from the stream's usage chunk. Engine counters (prefix-cache hits, preemptions,
compilations) are the /metrics difference around the run, and the peak KV usage is polled during it.
Every run sends its own cache_salt, so a run never hits blocks an earlier run (or the warm-up) left cached.
"""

import asyncio
import contextlib
import json
import math
import time
from typing import Optional

import httpx
import numpy as np

from jaxpaged.bench.bench_config import ModeConfig, SamplingConfig
from jaxpaged.bench.latency_stats import RequestTiming, run_metrics
from jaxpaged.bench.server_process import ServerProcess, parse_metrics
from jaxpaged.bench.workloads import BenchRequest

_KV_POLL_INTERVAL_S = 0.5
_ENGINE_METRICS = ("jaxpaged_prefix_cache_queries", "jaxpaged_prefix_cache_hits",
                   "jaxpaged_prefix_cache_missed_reusable_tokens", "jaxpaged_num_preemptions",
                   "jaxpaged_xla_compilations", "jaxpaged_kv_cache_usage_perc")


def poisson_offsets(num_arrivals: int, request_rate: float, seed: int) -> list[float]:
    """Arrival times (s from the start) of a Poisson process of `request_rate`/s; all 0 when the rate is inf."""
    if math.isinf(request_rate):
        return [0.0] * num_arrivals
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, size=num_arrivals)
    return [float(x) for x in np.cumsum(gaps) - gaps[0]]  # the first request goes at once


def conversation_groups(requests: list[BenchRequest]) -> list[list[int]]:
    """Request indices per client: a conversation's turns in order, every other request on its own."""
    groups: dict = {}
    for index, request in enumerate(requests):
        key = ("conversation", request.conversation_id) if request.conversation_id is not None else ("request", index)
        groups.setdefault(key, []).append(index)
    return sorted(groups.values(), key=lambda group: group[0])


def completion_body(request: BenchRequest, sampling: SamplingConfig, cache_salt: str,
                    max_tokens: Optional[int] = None, model: Optional[str] = None) -> dict:
    """The streamed /v1/completions request of one workload request (`model`: the served name, where the server
    wants one)."""
    body = {"prompt": list(request.prompt_token_ids), "max_tokens": max_tokens or request.max_tokens,
            "temperature": sampling.temperature, "ignore_eos": sampling.ignore_eos, "stream": True,
            "stream_options": {"include_usage": True}, "cache_salt": cache_salt}
    return {"model": model, **body} if model is not None else body


async def stream_completion(client: httpx.AsyncClient, body: dict) -> RequestTiming:
    """Send one request and time its SSE chunks (perf_counter clock)."""
    arrival = time.perf_counter()
    deliveries: list[float] = []
    num_output_tokens = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"/v1/completions answered {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            payload = json.loads(data)
            if "error" in payload:
                raise RuntimeError(f"stream error: {payload['error']}")
            if payload.get("choices"):
                deliveries.append(time.perf_counter())
            if payload.get("usage"):
                num_output_tokens = payload["usage"]["completion_tokens"]
    if not deliveries:
        raise RuntimeError("the stream ended without a single token")
    return RequestTiming(arrival, deliveries[0], deliveries[-1], len(body["prompt"]),
                         num_output_tokens if num_output_tokens is not None else len(deliveries), deliveries)


async def _poll_peak_kv_usage(client: httpx.AsyncClient, peak: list[float]) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError):
            usage = parse_metrics((await client.get("/metrics")).text).get("jaxpaged_kv_cache_usage_perc", 0.0)
            peak[0] = max(peak[0], usage)
        await asyncio.sleep(_KV_POLL_INTERVAL_S)


async def _drive(base_url: str, requests: list[BenchRequest], sampling: SamplingConfig, mode: ModeConfig,
                 cache_salt: str, model: Optional[str] = None) -> tuple[list[RequestTiming], float, float]:
    groups = conversation_groups(requests)
    offsets = poisson_offsets(len(groups), mode.request_rate, mode.arrival_seed)
    limit = asyncio.Semaphore(mode.max_concurrency or len(requests))
    timings: list[Optional[RequestTiming]] = [None] * len(requests)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=limits) as client:
        peak = [0.0]
        poller = asyncio.ensure_future(_poll_peak_kv_usage(client, peak))
        start = time.perf_counter()

        async def run_group(group: list[int], offset: float) -> None:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            for index in group:  # a conversation's next turn waits for the previous answer
                async with limit:
                    timings[index] = await stream_completion(client, completion_body(requests[index], sampling,
                                                                                     cache_salt, model=model))
        try:
            await asyncio.gather(*(run_group(group, offset) for group, offset in zip(groups, offsets)))
        finally:
            poller.cancel()
        duration_s = time.perf_counter() - start
    return [t for t in timings if t is not None], duration_s, peak[0]


async def _warm_up(base_url: str, num_requests: int, sampling: SamplingConfig, model: Optional[str]) -> None:
    rng = np.random.default_rng(12345)
    async with httpx.AsyncClient(base_url=base_url, timeout=None) as client:
        for index in range(num_requests):
            prompt = tuple(int(t) for t in rng.integers(1000, 30000, size=16))
            await stream_completion(client, completion_body(BenchRequest(prompt, 2), sampling, f"warmup-{index}",
                                                            model=model))


def warm_up_server(server: ServerProcess, num_requests: int, sampling: SamplingConfig,
                   model: Optional[str] = None) -> None:
    """A few short unmeasured requests on prompts outside the workload."""
    if num_requests > 0:
        asyncio.run(_warm_up(server.base_url, num_requests, sampling, model))


def run_online(server: ServerProcess, requests: list[BenchRequest], sampling: SamplingConfig, mode: ModeConfig,
               cache_salt: str) -> dict:
    """One measured run against a healthy server; the metrics of the run."""
    before = server.metrics()
    missing = [name for name in _ENGINE_METRICS if name not in before]
    if missing:  # a renamed metric would otherwise read as a silent 0
        raise RuntimeError(f"the server's /metrics lacks {missing}")
    timings, duration_s, peak_kv_usage = asyncio.run(_drive(server.base_url, requests, sampling, mode, cache_salt))
    after = server.metrics()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    queries = delta("jaxpaged_prefix_cache_queries")
    result = run_metrics(timings, duration_s)
    result.update({
        "peak_kv_usage": peak_kv_usage,
        "prefix_cache_hit_rate": delta("jaxpaged_prefix_cache_hits") / queries if queries else 0.0,
        "prefix_cache_missed_reusable_rate": (delta("jaxpaged_prefix_cache_missed_reusable_tokens") / queries
                                              if queries else 0.0),
        "num_preemptions": int(delta("jaxpaged_num_preemptions")),
        "num_compilations_measured": int(delta("jaxpaged_xla_compilations")),
        "server_startup_s": server.startup_s,
    })
    return result


def run_online_peer(server: ServerProcess, requests: list[BenchRequest], sampling: SamplingConfig, mode: ModeConfig,
                    cache_salt: str, model: str) -> dict:
    """One measured run against a peer's server (vLLM's): the client's figures only, its metrics are its own."""
    timings, duration_s, _ = asyncio.run(_drive(server.base_url, requests, sampling, mode, cache_salt, model))
    return {**run_metrics(timings, duration_s), "server_startup_s": server.startup_s}
