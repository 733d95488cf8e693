"""StepCostMeter: whether proposing pays at a batch size, measured as the engine runs (the cost half of adaptivity).

Acceptance alone cannot tell a costly proposer when to stop: a draft model whose proposals are all kept still loses
when one of its steps costs about what a target step does (a batch of 8 on a CPU, docs/speculative-decoding.md).
So the speculator times every step, from one update to the next (the proposing, the target's step and the update
all fall in between), and counts the tokens it emitted. Per batch-size class (powers of two) it keeps an
exponential average of seconds per emitted token with proposals and without, and proposes while that is no slower.
Each class tries the mode it is not in once EXPLORE_EVERY - 1 steps ran in the other, so an estimate never goes stale:
a load that changes, or requests whose output starts copying, moves the decision back. The try stays due until a step
in that mode is measured: with async scheduling the step after a decision is often already planned (its requests
have a token in flight and cannot propose), so a one-step window would be missed, and a turned-off draft never tried
again.
"""

import dataclasses
from typing import Optional

EXPLORE_EVERY = 16
"""Every this many steps at a batch size, the mode that measured slower runs once more (one step in 16 is what
keeping both estimates fresh costs)."""
SMOOTHING = 0.3
"""Weight of the newest step in each average: steps are noisy (the host's other work), decisions should not be."""


@dataclasses.dataclass
class _ClassCost:
    """Seconds per emitted token at one batch-size class, with and without proposals (None: never measured)."""

    with_proposals: Optional[float] = None
    without_proposals: Optional[float] = None
    steps_since_with: int = 0
    """Steps recorded since the last measured one with proposals."""
    steps_since_without: int = 0
    """Steps recorded since the last measured one without."""


def batch_class(batch_size: int) -> int:
    """The power of two at or above batch_size: nearby sizes share an estimate."""
    return 1 << max(batch_size - 1, 0).bit_length()


class StepCostMeter:
    """Per batch-size class: is a step with proposals cheaper per emitted token than one without?"""

    def __init__(self, explore_every: int = EXPLORE_EVERY, smoothing: float = SMOOTHING) -> None:
        self.explore_every = explore_every
        self.smoothing = smoothing
        self.classes: dict[int, _ClassCost] = {}

    def should_propose(self, batch_size: int) -> bool:
        """Whether the next step at this batch size proposes: the cheaper mode measured so far (proposals while
        they are unmeasured), and the other mode once explore_every - 1 steps ran without measuring it. Pure: asking
        twice before the step is recorded gives the same answer."""
        cost = self.classes.get(batch_class(batch_size))
        if cost is None or cost.with_proposals is None:
            return True
        due = self.explore_every - 1
        if cost.without_proposals is None or cost.with_proposals <= cost.without_proposals:
            return cost.steps_since_without < due
        return cost.steps_since_with >= due

    def record(self, batch_size: int, proposed: bool, seconds: float, num_tokens: int) -> None:
        """One step at batch_size took `seconds` and emitted num_tokens (a step that emitted none, a prefill's
        chunk, measures nothing: it only counts toward the other mode's next try)."""
        cost = self.classes.setdefault(batch_class(batch_size), _ClassCost())
        cost.steps_since_with += 1
        cost.steps_since_without += 1
        if num_tokens <= 0:
            return
        if proposed:
            cost.steps_since_with = 0
        else:
            cost.steps_since_without = 0
        per_token = seconds / num_tokens
        field = "with_proposals" if proposed else "without_proposals"
        previous = getattr(cost, field)
        setattr(cost, field, per_token if previous is None else previous + self.smoothing * (per_token - previous))
