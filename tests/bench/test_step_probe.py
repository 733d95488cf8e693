"""StepProbe on a fake engine: what it records, what it counts as live KV, and that it stops watching."""

import types

from jaxpaged.bench.step_probe import StepProbe
from jaxpaged.engine.step_timings import StepTimings


class FakeKV:
    block_size = 16
    usage = 0.25

    def __init__(self, tables):
        self.tables = tables

    def get_block_ids(self, request_id):
        return self.tables.get(request_id, [])


class FakeScheduler:
    def __init__(self, running, tables):
        self.running = running
        self.kv_cache_manager = FakeKV(tables)


class FakeEngine:
    """step() reports to its observers the way LLMEngine.step does (after each schedule, then after the step with
    its StepTimings) and produces one new token for request "a" (with final_only, through output_token_counts()
    alone, as if "a" were still running)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.observers = []
        self.num_tokens = 0
        self.hidden_steps: set[int] = set()
        """Steps (by number) that pretend async scheduling launched the next one while the device computed."""

    def step(self, final_only=False):
        for observer in self.observers:
            observer.after_schedule(self.scheduler)
        timings = StepTimings(schedule_s=0.002, prepare_s=0.001, scheduler_update_s=0.0005, process_s=0.003,
                              step_s=0.010 + self.num_tokens / 1000, hidden=self.num_tokens in self.hidden_steps)
        self.num_tokens += 1
        sample = types.SimpleNamespace(token_ids=list(range(self.num_tokens)))
        outputs = [] if final_only else [types.SimpleNamespace(request_id="a", outputs=[sample])]
        for observer in self.observers:
            observer.after_step(outputs, timings)
        return outputs

    def output_token_counts(self):
        return {"a": self.num_tokens}


def request(request_id, num_computed):
    return types.SimpleNamespace(request_id=request_id, num_computed_tokens=num_computed)


def test_shared_blocks_count_once_and_unwritten_slots_count_as_capacity():
    """a: 20 tokens in blocks [5, 6]; b: 18 in [5, 7]; c: 16 in [8, 9] (block 9 allocated, still empty).

    Distinct blocks 5..9 = 80 slots; live 16 (block 5, shared) + 4 + 2 + 16 + 0 = 38.
    """
    tables = {"a": [5, 6], "b": [5, 7], "c": [8, 9]}
    scheduler = FakeScheduler([request("a", 20), request("b", 18), request("c", 16)], tables)
    engine = FakeEngine(scheduler)
    with StepProbe(engine, track_kv_utilization=True) as probe:
        probe.after_schedule(scheduler)
    assert probe.kv_samples == [(38, 80, 3)]
    assert probe.peak_kv_usage == 0.25
    kv = probe.kv_metrics()
    assert kv["kv_utilization_mean"] == 38 / 80 and kv["max_concurrent_requests"] == 3


def test_step_timing_token_times_and_clean_exit():
    scheduler = FakeScheduler([], {})
    engine = FakeEngine(scheduler)
    with StepProbe(engine) as probe:
        for final_only in (False, True, True):
            engine.step(final_only=final_only)
    assert probe.step_s == [0.010, 0.011, 0.012]
    assert probe.host_s == [0.002 + 0.001 + 0.003] * 3  # schedule + prepare + process
    assert probe.scheduler_s == [0.002 + 0.0005] * 3  # schedule + update_from_output
    assert len(probe.token_times["a"]) == 3  # one delivery per new token, with final_only too
    assert probe.kv_samples == []  # not tracked unless asked
    assert engine.observers == []  # it stops watching when the block ends
    metrics = probe.host_metrics()
    host_ms, step_ms = metrics["host_ms_per_step_p50"], metrics["step_ms_p50"]
    assert metrics["num_steps"] == 3 and host_ms is not None and step_ms is not None and host_ms <= step_ms


def test_host_time_beside_a_computing_device_is_not_exposed():
    engine = FakeEngine(FakeScheduler([], {}))
    engine.hidden_steps = {1, 2}
    with StepProbe(engine) as probe:
        for _ in range(4):
            engine.step()
    assert [exposed == 0 for exposed in probe.exposed_host_s] == [False, True, True, False]
    assert [probe.exposed_host_s[i] for i in (0, 3)] == [probe.host_s[i] for i in (0, 3)]
    # median of [h0, 0, 0, h3]: half the smaller of the two exposed steps
    expected_ms = 1000 * min(probe.host_s[0], probe.host_s[3]) / 2
    exposed_ms = probe.host_metrics()["exposed_host_ms_per_step_p50"]
    assert exposed_ms is not None and abs(exposed_ms - expected_ms) < 1e-9
