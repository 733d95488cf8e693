"""The engine loops drive schedule -> execute -> update in the order each promises, and FeatureSet calls the
features' hooks in order (per-step hooks only on the features that override them)."""

import contextlib
import types
import typing

from jaxpaged.engine.loops import OverlappedLoop, StepPhases, SynchronousLoop
from jaxpaged.features.base import EngineFeature, FeatureSet


class RecordingPhases:
    """StepPhases of one data-parallel rank that log each call; step k's plan is "plan-k", its launch "launch-k",
    its outputs ["out-k"]."""

    def __init__(self, num_steps: int, plan_ahead: bool = True, needs_last_tokens: bool = False):
        self.log: list[str] = []
        self.num_planned = 0
        self.num_applied = 0
        self.num_steps = num_steps
        self.plan_ahead = plan_ahead
        self.needs_last_tokens = needs_last_tokens

    def release_held_back(self):
        self.log.append("release")

    def dp_ranks(self):
        return range(1)

    def schedule(self, dp_rank):
        self.num_planned += 1
        self.log.append(f"schedule-{self.num_planned}")
        return f"plan-{self.num_planned}"

    def execute(self, dp_rank, plan, defer_sampling=False):
        number = plan.split('-')[1]
        self.log.append(f"execute-{number}" + (" (model only)" if defer_sampling else ""))
        running = types.SimpleNamespace(is_running=lambda: True)
        return types.SimpleNamespace(name=f"launch-{number}", sampled=lambda: running)

    def in_lock_step(self):
        return False

    def update(self, launched, final_only, sample_next=None):
        self.num_applied += 1
        number = launched[0].name.split('-')[1]
        self.log.append(f"update-{number}")
        if sample_next:
            self.log.append(f"sample-{sample_next[0].name.split('-')[1]}")
        return [f"out-{number}"]

    def may_plan_ahead(self):
        return self.plan_ahead and self.num_planned < self.num_steps

    def sampling_needs_last_tokens(self):
        return self.needs_last_tokens

    def has_unfinished_requests(self):
        return self.num_applied < self.num_steps


def as_phases(phases: RecordingPhases) -> StepPhases:
    """The recorder's plans and launches are strings and namespaces: the loops only pass them along."""
    return typing.cast(StepPhases, phases)


def test_the_synchronous_loop_is_schedule_execute_update_per_step():
    phases = RecordingPhases(num_steps=2)
    loop = SynchronousLoop(as_phases(phases))
    assert [loop.step(False) for _ in range(2)] == [(["out-1"], False), (["out-2"], False)]
    assert phases.log == ["release", "schedule-1", "execute-1", "update-1",
                          "release", "schedule-2", "execute-2", "update-2"]


class LockStepPhases(RecordingPhases):
    """Two data-parallel ranks in lock step: their plans ("plan-k" each) run as one step."""

    def dp_ranks(self):
        return range(2)

    def in_lock_step(self):
        return True

    def execute_together(self, plans, defer_sampling=False):
        self.log.append("execute together " + ", ".join(plans))
        running = types.SimpleNamespace(is_running=lambda: True)
        return [types.SimpleNamespace(name=plan.replace("plan", "launch"), sampled=lambda: running) for plan in plans]


def test_ranks_in_lock_step_all_plan_then_execute_as_one_step():
    """With ranks in lock step every rank schedules before the one execute (independent ranks interleave)."""
    phases = LockStepPhases(num_steps=2)
    loop = SynchronousLoop(as_phases(phases))
    loop.step(False)
    assert phases.log == ["release", "schedule-1", "schedule-2", "execute together plan-1, plan-2", "update-1"]


def test_the_overlapped_loop_launches_the_next_step_before_applying_this_one():
    phases = RecordingPhases(num_steps=3)
    loop = OverlappedLoop(as_phases(phases))
    results = [loop.step(False) for _ in range(3)]
    assert [outputs for outputs, _ in results] == [["out-1"], ["out-2"], ["out-3"]]
    assert [hidden for _, hidden in results] == [True, True, False]  # nothing left to plan beside step 3
    assert phases.log == ["release", "schedule-1", "execute-1", "schedule-2", "execute-2", "update-1",
                          "release", "schedule-3", "execute-3", "update-2", "release", "update-3"]
    assert loop.in_flight is None


def test_the_overlapped_loop_runs_step_by_step_when_it_may_not_plan_ahead():
    phases = RecordingPhases(num_steps=2, plan_ahead=False)
    loop = OverlappedLoop(as_phases(phases))
    assert [loop.step(False) for _ in range(2)] == [(["out-1"], False), (["out-2"], False)]
    assert phases.log == ["release", "schedule-1", "execute-1", "update-1",
                          "release", "schedule-2", "execute-2", "update-2"]


def test_the_overlapped_loop_defers_the_next_sampler_when_a_request_needs_its_last_token_on_the_host():
    phases = RecordingPhases(num_steps=3, needs_last_tokens=True)
    loop = OverlappedLoop(as_phases(phases))
    assert [outputs for outputs, _ in (loop.step(False) for _ in range(3))] == [["out-1"], ["out-2"], ["out-3"]]
    # The model of step k+1 runs beside step k; its sampler is dispatched by update-k, once k's tokens are in.
    assert phases.log == ["release", "schedule-1", "execute-1", "schedule-2", "execute-2 (model only)", "update-1",
                          "sample-2", "release", "schedule-3", "execute-3 (model only)", "update-2", "sample-3",
                          "release", "update-3"]


class Recorder(EngineFeature):
    def __init__(self, name: str, log: list[str], guards: bool = False):
        self.name, self.log, self.guards = name, log, guards

    def after_warmup(self, ranks):
        self.log.append(f"{self.name}.after_warmup")

    def on_reset(self):
        self.log.append(f"{self.name}.on_reset")

    def close(self, ranks, deadline=None):
        self.log.append(f"{self.name}.close")


class Guarding(Recorder):
    @contextlib.contextmanager
    def _guard(self):
        self.log.append(f"{self.name}.enter")
        yield
        self.log.append(f"{self.name}.exit")

    def step_guard(self):
        return self._guard()

    def after_launch(self, pending):
        self.log.append(f"{self.name}.after_launch({pending})")


def test_a_feature_set_calls_every_feature_in_order_and_per_step_hooks_only_where_overridden():
    log: list[str] = []
    plain, guarding = Recorder("a", log), Guarding("b", log)
    features = FeatureSet([plain, guarding])
    assert features.find(Guarding) is guarding and FeatureSet([plain]).find(Guarding) is None
    features.after_warmup(None)  # type: ignore[arg-type]
    with features.step_guard():
        features.after_launch("step-1")  # type: ignore[arg-type]
    features.on_reset()
    features.close(None)  # type: ignore[arg-type]
    assert log == ["a.after_warmup", "b.after_warmup", "b.enter", "b.after_launch(step-1)", "b.exit",
                   "a.on_reset", "b.on_reset", "a.close", "b.close"]


def test_no_feature_means_no_guard_and_no_lower_tiers():
    features = FeatureSet()
    assert isinstance(features.step_guard(), contextlib.nullcontext)
    assert features.lower_tiers is None
