"""vLLM's stats line (throughput over the interval, running, waiting, KV cache usage, prefix cache hit rate), one
idle line rather than one per interval, --disable-log-stats / --enable-log-requests, and the request log line."""

import logging

from jaxpaged.cli import build_parser
from jaxpaged.engine.stats import EngineStats
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.server.serve_flags import settings_from_args
from jaxpaged.server.stats_log import StatsLogger, log_request, stats_line


def _stats(prompt: int, generated: int, queries: int, hits: int, running: int = 0, waiting: int = 0,
           usage: float = 0.0) -> EngineStats:
    return EngineStats(num_running=running, num_waiting=waiting, kv_cache_usage=usage, prefix_cache_queries=queries,
                       prefix_cache_hits=hits, num_preemptions=0, num_compilations=0, prompt_tokens_total=prompt,
                       generation_tokens_total=generated, num_steps=0, warmup_seconds=0.0)


def test_the_stats_line_has_vllm_s_fields_over_the_interval():
    """Throughputs and the hit rate are over the interval (hand-worked: 2000 prompt tokens in 10 s = 200/s)."""
    line = stats_line(_stats(1000, 500, 400, 100), _stats(3000, 1500, 800, 400, running=3, waiting=2, usage=0.125),
                      10.0)
    assert line == ("Avg prompt throughput: 200.0 tokens/s, Avg generation throughput: 100.0 tokens/s, "
                    "Running: 3 reqs, Waiting: 2 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 75.0%")
    assert stats_line(None, _stats(0, 0, 0, 0), 10.0).endswith("Prefix cache hit rate: 0.0%")  # no queries: 0


def test_an_idle_engine_logs_one_idle_line_then_nothing_until_work_comes(caplog):
    """A server that waits for traffic does not fill its log with identical zero lines."""
    snapshots = iter([_stats(0, 0, 0, 0), _stats(10, 5, 0, 0, running=1), _stats(10, 5, 0, 0),
                      _stats(10, 5, 0, 0), _stats(10, 5, 0, 0), _stats(20, 9, 0, 0, running=1)])
    stats_logger = StatsLogger(lambda: next(snapshots), interval_s=10.0)
    with caplog.at_level(logging.INFO, logger="jaxpaged.stats"):
        lines = [stats_logger.log_once(10.0) for _ in range(5)]
    assert lines[0] is not None and "Running: 1 reqs" in lines[0]
    assert lines[1] is not None and "Avg prompt throughput: 0.0" in lines[1]  # the first idle interval
    assert lines[2] is None and lines[3] is None  # still idle: nothing
    assert lines[4] is not None and "Avg prompt throughput: 1.0 tokens/s" in lines[4]
    assert len(caplog.records) == 3


def test_the_log_flags_reach_the_settings():
    """--enable-log-requests turns the request log on; --disable-log-stats parses (stats are on by default)."""
    args = build_parser().parse_args(["serve", "m", "--enable-log-requests", "--disable-log-stats"])
    assert settings_from_args(args).log_requests and args.disable_log_stats
    args = build_parser().parse_args(["serve", "m"])
    assert not settings_from_args(args).log_requests and not args.disable_log_stats


def test_a_request_log_line_names_the_request_its_prompt_length_and_its_params(caplog):
    """One line: the id, the prompt's token count, the sampling parameters."""
    with caplog.at_level(logging.INFO, logger="jaxpaged.stats"):
        log_request("chatcmpl-1", 42, SamplingParams(max_tokens=7, temperature=0.5))
    [record] = caplog.records
    assert "chatcmpl-1" in record.getMessage() and "prompt tokens: 42" in record.getMessage()
    assert "max_tokens=7" in record.getMessage() and "temperature=0.5" in record.getMessage()
