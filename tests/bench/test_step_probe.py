"""StepProbe on a fake engine: what it times, what it counts as live KV, and that it leaves no trace."""

import types

from jaxpaged.bench.step_probe import StepProbe


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

    def schedule(self):
        return "scheduled"

    def update_from_output(self, output, token_ids):
        return []


class FakeRunner:
    def prepare(self, output):
        return None


class FakeEngine:
    """step() calls the parts the way LLMEngine.step does and reports one new token for request "a" (with
    final_only, through output_token_counts() alone, as if "a" were still running)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.runner = FakeRunner()
        self.schedulers, self.runners = [scheduler], [self.runner]  # one data-parallel rank
        self.num_tokens = 0
        self.last_step_hidden = False
        self.hidden_steps: set[int] = set()
        """Steps (by number) that pretend async scheduling launched the next one while the device computed."""

    def step(self, final_only=False):
        output = self.scheduler.schedule()
        self.runner.prepare(output)
        self.last_step_hidden = self.num_tokens in self.hidden_steps
        return self.update(output, [], final_only=final_only)

    def update(self, output, token_ids, final_only=False):
        self.scheduler.update_from_output(output, token_ids)
        self.num_tokens += 1
        sample = types.SimpleNamespace(token_ids=list(range(self.num_tokens)))
        return [] if final_only else [types.SimpleNamespace(request_id="a", outputs=[sample])]

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
    with StepProbe(FakeEngine(scheduler), track_kv_utilization=True) as probe:
        scheduler.schedule()
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
    assert len(probe.step_s) == len(probe.host_s) == len(probe.scheduler_s) == 3
    assert all(0 < scheduler_s <= host_s <= step_s for scheduler_s, host_s, step_s
               in zip(probe.scheduler_s, probe.host_s, probe.step_s))
    assert len(probe.token_times["a"]) == 3  # one delivery per new token, with final_only too
    assert probe.kv_samples == []  # not tracked unless asked
    # the probe's wrappers are gone: the class methods show through again
    assert "step" not in vars(engine) and "schedule" not in vars(scheduler) and "prepare" not in vars(engine.runner)
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
