"""StepProbe: records the host parts of every engine step and the token deliveries, as an engine observer.

For the length of a `with` block it is one of the engine's `observers` (jaxpaged/engine/step_timings.py): the
engine reports each step's host time by phase (scheduling, padding the batch, applying sampled tokens and
detokenizing) and the probe keeps them, so LLM.generate runs unchanged while it watches. The rest of the wall
time of a step is the device (and the transfers), which cannot be timed apart on an asynchronous backend.
"""

import collections
import statistics
import time
from typing import Optional


class StepProbe:
    """Per-step host timings, token delivery times and KV usage of one engine, while installed."""

    def __init__(self, engine, *, track_kv_utilization: bool = False):
        self.engine = engine
        self.track_kv_utilization = track_kv_utilization
        """Also record live tokens and allocated block capacity after every schedule() (costs host time)."""
        self.step_s: list[float] = []
        """Wall time of each engine.step()."""
        self.host_s: list[float] = []
        """Host time of each step: schedule + prepare + engine.update (update_from_output and output processing)."""
        self.exposed_host_s: list[float] = []
        """Host time of each step the device waited for: host_s, or 0 when async scheduling launched the next step
        while the device still computed this one (StepTimings.hidden), so the host worked beside it."""
        self.scheduler_s: list[float] = []
        """Scheduler time of each step: schedule + update_from_output."""
        self.token_times: dict[str, list[float]] = collections.defaultdict(list)
        """request id -> time.time() of each token's delivery."""
        self.peak_kv_usage = 0.0
        self.kv_samples: list[tuple[int, int, int]] = []
        """(live tokens, allocated block capacity in tokens, running requests) after each schedule()."""
        # live tokens: distinct KV slots written (or being written this step) that a running request can read

    # ---- install / remove ------------------------------------------------------------------------------------
    def __enter__(self) -> "StepProbe":
        self.engine.observers.append(self)
        return self

    def __exit__(self, *exc_info) -> None:
        self.engine.observers.remove(self)

    # ---- StepObserver (jaxpaged/engine/step_timings.py) -----------------------------------------------------
    def after_schedule(self, scheduler) -> None:
        """Read after schedule(): its allocations are in, update_from_output() has not freed anything yet."""
        usage = scheduler.kv_cache_manager.usage
        if usage > self.peak_kv_usage:
            self.peak_kv_usage = usage
        if self.track_kv_utilization:
            self._sample_kv(scheduler)

    def after_step(self, outputs, timings) -> None:
        """Record one step's timings and the tokens it delivered."""
        self.step_s.append(timings.step_s)
        host = timings.host_s
        self.host_s.append(host)
        self.exposed_host_s.append(0.0 if timings.hidden else host)
        self.scheduler_s.append(timings.schedule_s + timings.scheduler_update_s)
        now = time.time()
        # Read from the engine as well as the outputs: LLM.generate asks only for finished ones (final_only).
        counts = self.engine.output_token_counts()
        for output in outputs:
            counts[output.request_id] = sum(len(sample.token_ids) for sample in output.outputs)
        for request_id, num_tokens in counts.items():
            delivered = self.token_times[request_id]
            delivered.extend([now] * (num_tokens - len(delivered)))

    def _sample_kv(self, scheduler) -> None:
        # NOTE: a block shared through the prefix cache is counted once, holding as many live tokens as its
        # fullest holder has computed; a block allocated for tokens not computed yet holds none.
        kv = scheduler.kv_cache_manager
        block_size = kv.block_size
        filled: dict[int, int] = {}
        for request in scheduler.running:
            num_computed = request.num_computed_tokens
            for index, block_id in enumerate(kv.get_block_ids(request.request_id)):
                in_block = min(block_size, max(0, num_computed - index * block_size))
                if in_block > filled.get(block_id, -1):
                    filled[block_id] = in_block
        self.kv_samples.append((sum(filled.values()), len(filled) * block_size, len(scheduler.running)))

    # ---- results ---------------------------------------------------------------------------------------------
    def host_metrics(self) -> dict[str, Optional[float]]:
        """Median wall time of a step, and of its host parts, in milliseconds."""
        if not self.step_s:
            return {"num_steps": 0, "step_ms_p50": None, "host_ms_per_step_p50": None,
                    "exposed_host_ms_per_step_p50": None, "scheduler_ms_per_step_p50": None}
        return {"num_steps": len(self.step_s), "step_ms_p50": 1000 * statistics.median(self.step_s),
                "host_ms_per_step_p50": 1000 * statistics.median(self.host_s),
                "exposed_host_ms_per_step_p50": 1000 * statistics.median(self.exposed_host_s),
                "scheduler_ms_per_step_p50": 1000 * statistics.median(self.scheduler_s)}

    def kv_metrics(self) -> dict[str, Optional[float]]:
        """Most concurrent requests and the paged cache's utilization (live tokens / allocated capacity)."""
        samples = [s for s in self.kv_samples if s[1] > 0]
        if not samples:
            return {"max_concurrent_requests": None, "kv_utilization_mean": None, "kv_utilization_at_peak": None}
        live = sum(s[0] for s in samples)
        capacity = sum(s[1] for s in samples)
        peak = max(samples, key=lambda s: s[1])
        return {"max_concurrent_requests": max(s[2] for s in samples), "kv_utilization_mean": live / capacity,
                "kv_utilization_at_peak": peak[0] / peak[1]}
