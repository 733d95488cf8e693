"""The step-cost meter (speculative/step_cost.py): hand-worked decisions, and the speculator with a meter on a real
scheduler and a fake clock: proposals stop where steps with them cost more per emitted token, and come back."""

import pytest

from jaxpaged.config import SpeculativeConfig
from jaxpaged.core import Request
from jaxpaged.speculative.proposal import ProposalBatch
from jaxpaged.speculative.speculator import Speculator
from jaxpaged.speculative.step_cost import StepCostMeter, batch_class
from tests.core.core_helpers import build_scheduler


def test_batch_sizes_share_an_estimate_up_to_the_next_power_of_two():
    assert [batch_class(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 64)] == [1, 1, 2, 4, 4, 8, 8, 16, 64]


def test_untried_batch_sizes_propose_and_an_unmeasured_plain_step_stays_due_until_measured():
    meter = StepCostMeter(explore_every=4)
    assert meter.should_propose(3)
    decisions = []
    for _ in range(3):
        decisions.append(meter.should_propose(3))
        meter.record(3, True, 2.0, 4)  # 0.5 s per token with proposals; the plain cost is still unmeasured
    assert decisions == [True, True, True] and not meter.should_propose(3)  # 3 steps since: plain is due
    meter.record(3, False, 0.0, 0)  # that step was planned before the decision (nothing emitted, nothing measured)
    assert not meter.should_propose(3)  # still due
    meter.record(3, False, 1.0, 1)  # 1 s per token without: proposals are cheaper
    assert meter.classes[4].without_proposals == 1.0 and meter.classes[4].with_proposals == 0.5
    assert meter.should_propose(3)


def test_the_cheaper_mode_wins_and_the_other_is_retried_every_period():
    meter = StepCostMeter(explore_every=4, smoothing=0.5)
    meter.record(1, True, 3.0, 1)   # 3 s per token with proposals
    meter.record(1, False, 1.0, 1)  # 1 s without
    decisions = []
    for _ in range(8):
        proposed = meter.should_propose(1)
        decisions.append(proposed)
        meter.record(1, proposed, 3.0 if proposed else 1.0, 1)
    assert decisions == [False, False, True, False, False, False, True, False]  # one step with, then 3 without
    meter.record(1, True, 0.2, 1)  # proposals turn cheap (say the output starts copying): the average moves
    assert meter.classes[1].with_proposals == pytest.approx(1.6)  # 3.0 + 0.5 * (0.2 - 3.0)
    meter.record(1, True, 0.2, 1)
    meter.record(1, True, 0.2, 1)
    assert meter.classes[1].with_proposals == pytest.approx(0.55)  # cheaper than 1 s without now
    assert not meter.should_propose(1)  # ... but 3 steps since the last plain one: it is retried first
    meter.record(1, False, 1.0, 1)
    assert meter.should_propose(1)


class AlwaysProposes:
    """A proposer that proposes token 1 as often as it may (the meter, not the proposals, is under test)."""

    def propose(self, batch: ProposalBatch):
        return [([1] * count, None) for count in batch.max_tokens]

    def warmup(self) -> float:
        return 0.0

    def retain(self, running) -> None:
        pass


def _run_steps(speculator: Speculator, scheduler, clock: list[float], num_steps: int, proposal_cost: float,
               plain_cost: float) -> list[bool]:
    """num_steps engine steps: schedule, every proposal accepted (acceptance stays high: the cost alone decides),
    the fake clock advanced by the step's cost, then the speculator's update. Whether each step carried proposals."""
    carried = []
    for _ in range(num_steps):
        output = scheduler.schedule()
        # Each sampling row's draws: its proposals as proposed (1s), then the bonus token 0.
        rows = [token for item in output.scheduled if item.sample for token in [1] * item.num_spec_tokens + [0]]
        proposed = any(item.num_spec_tokens for item in output.scheduled)
        carried.append(proposed)
        scheduler.update_from_output(output, rows)
        clock[0] += proposal_cost if proposed else plain_cost
        speculator.after_update(scheduler)
    return carried


@pytest.mark.parametrize("proposal_cost, plain_cost, expect_proposals", [(6.0, 1.0, False), (1.0, 1.0, True)])
def test_the_speculator_proposes_only_where_it_pays(proposal_cost, plain_cost, expect_proposals):
    # Room for both requests' 49 steps of up to 3 tokens each: none finishes during the test.
    scheduler = build_scheduler(max_spec_tokens_per_step=32, num_kv_blocks=128, max_model_len=256)
    for i in range(2):
        scheduler.add_request(Request(f"r{i}", [5, 6, 7], max_tokens=500))
    clock = [0.0]
    meter = StepCostMeter(explore_every=8)
    speculator = Speculator(SpeculativeConfig(speculative_method="ngram", num_speculative_tokens=2),
                            AlwaysProposes(), meter, clock=lambda: clock[0])
    _run_steps(speculator, scheduler, clock, 17, proposal_cost, plain_cost)  # prefill, then both modes measured
    carried = _run_steps(speculator, scheduler, clock, 32, proposal_cost, plain_cost)
    if expect_proposals:
        assert carried.count(False) == 4  # a plain step every 8 keeps its estimate fresh
    else:
        assert carried.count(True) == 4  # the losing mode, retried once a period
    assert speculator.proposes_at(scheduler) == meter.should_propose(2)
    # Per emitted token: two requests emit 1 + 2 tokens each with proposals, 1 each without.
    assert meter.classes[2].with_proposals == pytest.approx(proposal_cost / 6)
    assert meter.classes[2].without_proposals == pytest.approx(plain_cost / 2)
