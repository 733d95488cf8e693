"""vLLM's periodic stats line (every 10 s unless --disable-log-stats) and its request log (--enable-log-requests).

The stats line has vLLM's fields: prompt and generation throughput over the interval, running and waiting
requests, KV cache usage and the prefix cache hit rate over the interval. An idle engine logs one idle line, not
one every interval. The request log has one line per engine request: its id, prompt length and sampling
parameters; never the prompt's text nor the API key (neither is in those fields).
"""

import logging
import threading
from collections.abc import Callable
from typing import Optional

from jaxpaged.engine.stats import EngineStats
from jaxpaged.sampling.params import SamplingParams

logger = logging.getLogger("jaxpaged.stats")
DEFAULT_STATS_INTERVAL_S = 10.0
"""vLLM's interval between two stats lines."""


def stats_line(previous: Optional[EngineStats], current: EngineStats, elapsed_s: float) -> str:
    """The stats line for the interval from `previous` (None: since start) to `current`, `elapsed_s` long."""
    def delta(field: str) -> int:
        return getattr(current, field) - (getattr(previous, field) if previous is not None else 0)

    seconds = max(elapsed_s, 1e-9)
    queries, hits = delta("prefix_cache_queries"), delta("prefix_cache_hits")
    hit_rate = 100.0 * hits / queries if queries > 0 else 0.0
    return (f"Avg prompt throughput: {delta('prompt_tokens_total') / seconds:.1f} tokens/s, "
            f"Avg generation throughput: {delta('generation_tokens_total') / seconds:.1f} tokens/s, "
            f"Running: {current.num_running} reqs, Waiting: {current.num_waiting} reqs, "
            f"KV cache usage: {100.0 * current.kv_cache_usage:.1f}%, Prefix cache hit rate: {hit_rate:.1f}%")


def _is_idle(previous: Optional[EngineStats], current: EngineStats) -> bool:
    unchanged = previous is not None and (previous.prompt_tokens_total, previous.generation_tokens_total) == (
        current.prompt_tokens_total, current.generation_tokens_total)
    return unchanged and current.num_running == 0 and current.num_waiting == 0


class StatsLogger:
    """A daemon thread logging stats_line every interval_s from `get_stats` (the engine's snapshot); stop() ends
    it."""

    def __init__(self, get_stats: Callable[[], Optional[EngineStats]],
                 interval_s: float = DEFAULT_STATS_INTERVAL_S) -> None:
        self._get_stats, self._interval_s = get_stats, interval_s
        self._stop = threading.Event()
        self._previous: Optional[EngineStats] = get_stats()
        self._logged_idle = False
        self._thread = threading.Thread(target=self._run, name="jaxpaged-stats", daemon=True)

    def start(self) -> "StatsLogger":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def log_once(self, elapsed_s: float) -> Optional[str]:
        """Logs the line for the last `elapsed_s` seconds and returns it (None: nothing logged, the engine idle
        again or not started)."""
        current = self._get_stats()
        if current is None:
            return None
        idle = _is_idle(self._previous, current)
        line = None
        if not (idle and self._logged_idle):
            line = stats_line(self._previous, current, elapsed_s)
            logger.info("%s", line)
        self._logged_idle, self._previous = idle, current
        return line

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.log_once(self._interval_s)


def log_request(request_id: str, num_prompt_tokens: int, params: SamplingParams) -> None:
    """One request log line (--enable-log-requests): id, prompt length, sampling parameters."""
    logger.info("Received request %s: prompt tokens: %d, params: %r", request_id, num_prompt_tokens, params)
