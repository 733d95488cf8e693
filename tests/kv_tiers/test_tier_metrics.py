"""/metrics shows hits, bytes moved and usage per KV tier, labelled by tier, only while the tiers are on."""

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest

from jaxpaged.engine.stats import EngineStats
from jaxpaged.kv_tiers import TierStats
from jaxpaged.server.metrics import _EngineStatsCollector


@dataclasses.dataclass
class StubEngine:
    stats: EngineStats
    is_alive: bool = True

    def get_stats(self) -> EngineStats:
        return self.stats


def scrape(stats: EngineStats) -> str:
    registry = CollectorRegistry()
    registry.register(_EngineStatsCollector(StubEngine(stats)))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def engine_stats(**fields) -> EngineStats:
    return EngineStats(num_running=0, num_waiting=0, kv_cache_usage=0.0, prefix_cache_queries=3000,
                       prefix_cache_hits=2000, num_preemptions=0, num_compilations=0, prompt_tokens_total=3000,
                       generation_tokens_total=0, num_steps=1, warmup_seconds=0.0, **fields)


def test_per_tier_series():
    text = scrape(engine_stats(kv_tiers={
        "device": TierStats(hit_tokens=992, bytes_used=10, capacity_bytes=100, num_blocks=62),
        "host": TierStats(hit_blocks=50, hit_tokens=800, bytes_in=4096, bytes_out=2048, bytes_used=4096,
                          capacity_bytes=8192, num_blocks=4),
        "disk": TierStats(hit_blocks=13, hit_tokens=208, bytes_used=777, capacity_bytes=10**9, corrupt_entries=1)}))
    assert 'jaxpaged_kv_tier_hit_tokens_total{tier="device"} 992.0' in text
    assert 'jaxpaged_kv_tier_hit_tokens_total{tier="host"} 800.0' in text
    assert 'jaxpaged_kv_tier_bytes_out_total{tier="host"} 2048.0' in text
    assert 'jaxpaged_kv_tier_bytes_used{tier="disk"} 777.0' in text
    assert 'jaxpaged_kv_tier_capacity_bytes{tier="host"} 8192.0' in text
    assert 'jaxpaged_kv_tier_corrupt_entries_total{tier="disk"} 1.0' in text
    assert 'jaxpaged_kv_tier_blocks{tier="device"} 62.0' in text


def test_no_tier_series_while_the_tiers_are_off():
    assert "kv_tier" not in scrape(engine_stats())
