"""The soak (benchmarks/soak), 20 seconds of it: with slow readers, disconnects and refused requests alongside, the
server answers no 5xx, every refused request gets its 4xx, RSS stays bounded, KV usage returns to 0 and the normal
streams keep their pace."""

import pytest

pytestmark = pytest.mark.slow


def test_a_short_soak_holds_its_bounds(tmp_path):
    from benchmarks.soak.__main__ import soak

    result = soak(seconds=20.0, quiet_seconds=10.0, num_normal=2, model=None, log_path=tmp_path / "server.log",
                  max_rss_growth_mib=256.0)
    checks = result["checks"]
    assert checks["no_5xx"] and checks["expected_statuses"], result
    assert checks["kv_usage_back_to_0"] and checks["rss_bounded"], result
    assert result["mixed_streams"] > 0 and set(result["statuses"]) >= {"200", "400", "413", "415"}, result
    # NOTE: 20 seconds give a few hundred gaps, whose p99 is their third largest: on shared CPUs one scheduling
    # hiccup moves it. The 2x bound is the 2-minute run's (`python -m benchmarks.soak`); here a looser one.
    assert result["p99_ratio"] <= 3.0, result
