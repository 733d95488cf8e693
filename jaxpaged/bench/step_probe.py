"""StepProbe: times the host parts of every engine step and records token deliveries, without touching the engine.

It shadows a few public methods with instance attributes for the length of a `with` block (LLMEngine.step and
LLMEngine.update, and every rank's Scheduler.schedule / update_from_output and ModelRunner.prepare), so
LLM.generate runs unchanged while the probe watches. Host time per step is what is left of a step on the host:
scheduling, padding the batch, applying sampled tokens and detokenizing. The rest of the wall time of a step is
the device (and the transfers), which cannot be timed apart on an asynchronous backend.
"""

import collections
import statistics
import time
from typing import Optional

_HOST_PARTS = ("schedule", "prepare", "update", "process")


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
        while the device still computed this one (LLMEngine.last_step_hidden), so the host worked beside it."""
        self.scheduler_s: list[float] = []
        """Scheduler time of each step: schedule + update_from_output."""
        self._current: dict[str, float] = dict.fromkeys(_HOST_PARTS, 0.0)
        self.token_times: dict[str, list[float]] = collections.defaultdict(list)
        """request id -> time.time() of each token's delivery."""
        self.peak_kv_usage = 0.0
        self.kv_samples: list[tuple[int, int, int]] = []
        """(live tokens, allocated block capacity in tokens, running requests) after each schedule()."""
        # live tokens: distinct KV slots written (or being written this step) that a running request can read
        self._installed: list[tuple[object, str]] = []

    # ---- install / remove ------------------------------------------------------------------------------------
    def __enter__(self) -> "StepProbe":
        engine = self.engine
        self._shadow(engine, "step", self._timed_step(engine.step))
        for scheduler, runner in zip(engine.schedulers, engine.runners):  # every data-parallel rank
            self._shadow(scheduler, "schedule", self._timed_schedule(scheduler))
            self._shadow(scheduler, "update_from_output", self._timed(scheduler.update_from_output, "update"))
            self._shadow(runner, "prepare", self._timed(runner.prepare, "prepare"))
        self._shadow(engine, "update", self._timed(engine.update, "process"))
        return self

    def __exit__(self, *exc_info) -> None:
        for owner, name in reversed(self._installed):
            delattr(owner, name)  # the class's own method shows through again
        self._installed.clear()

    def _shadow(self, owner, name: str, replacement) -> None:
        setattr(owner, name, replacement)
        self._installed.append((owner, name))

    # ---- wrappers --------------------------------------------------------------------------------------------
    def _timed(self, method, part: str):
        current = self._current

        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = method(*args, **kwargs)
            current[part] += time.perf_counter() - start
            return result
        return timed

    def _timed_schedule(self, scheduler):
        current = self._current
        schedule = scheduler.schedule

        def timed_schedule():
            start = time.perf_counter()
            output = schedule()
            current["schedule"] += time.perf_counter() - start
            # NOTE: read after schedule(): its allocations are in, update_from_output() has not freed anything yet.
            usage = scheduler.kv_cache_manager.usage
            if usage > self.peak_kv_usage:
                self.peak_kv_usage = usage
            if self.track_kv_utilization:
                self._sample_kv(scheduler)
            return output
        return timed_schedule

    def _timed_step(self, step):
        current = self._current

        def timed_step(**options):
            for part in _HOST_PARTS:
                current[part] = 0.0
            start = time.perf_counter()
            outputs = step(**options)
            self.step_s.append(time.perf_counter() - start)
            # engine.update ("process") contains scheduler.update_from_output ("update"): count it once.
            host = current["schedule"] + current["prepare"] + current["process"]
            self.host_s.append(host)
            self.exposed_host_s.append(0.0 if self.engine.last_step_hidden else host)
            self.scheduler_s.append(current["schedule"] + current["update"])
            now = time.time()
            # Read from the engine as well as the outputs: LLM.generate asks only for finished ones (final_only).
            counts = self.engine.output_token_counts()
            for output in outputs:
                counts[output.request_id] = sum(len(sample.token_ids) for sample in output.outputs)
            for request_id, num_tokens in counts.items():
                delivered = self.token_times[request_id]
                delivered.extend([now] * (num_tokens - len(delivered)))
            return outputs
        return timed_step

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
