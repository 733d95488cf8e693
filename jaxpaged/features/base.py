"""EngineFeature: the named points of the engine loop an optional feature plugs into, and FeatureSet.

The loop (engine/loops.py) calls, in order: `step_guard` around a step, `after_launch` once a rank's step is
dispatched (before its results are awaited), `after_step` once a step's results are applied (and after a prefix-cache
reset), and the engine calls the lifecycle hooks: `after_warmup` once the
ranks are compiled, `on_add` when a request is queued, `on_idle` while nothing runs, `on_reset` when the prefix
cache is cleared, `add_stats` when stats are read and `close` at shutdown. Every hook is a no-op here.
"""

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Optional

from jaxpaged.core.lower_tiers import LowerTiers

if TYPE_CHECKING:  # the engine's own types, for annotations only (the engine imports this module)
    from jaxpaged.engine.ranks import DataParallelRanks
    from jaxpaged.engine.requests import RequestGroup
    from jaxpaged.engine.stats import EngineStats
    from jaxpaged.sampling.token_sampler import PendingSample


class EngineFeature:
    """An optional feature of the engine; subclasses override the hooks they need."""

    def after_warmup(self, ranks: "DataParallelRanks") -> None:
        """Every rank is built and compiled."""

    def on_add(self, group: "RequestGroup", dp_rank: int, ranks: "DataParallelRanks") -> None:
        """A request was queued on data-parallel rank `dp_rank`."""

    def step_guard(self) -> contextlib.AbstractContextManager[None]:
        """Bounds one synchronous engine step."""
        return contextlib.nullcontext()

    def after_launch(self, pending: "PendingSample") -> None:
        """A rank's step was dispatched to its devices."""

    def after_step(self, ranks: "DataParallelRanks") -> None:
        """A step's results are applied to the schedulers (or the prefix cache was reset): their caches changed."""

    def on_idle(self) -> None:
        """Called between steps while no request runs."""

    def on_reset(self) -> None:
        """The prefix cache was cleared on every rank."""

    def add_stats(self, stats: "EngineStats", ranks: "DataParallelRanks") -> None:
        """Fill the feature's fields of a stats snapshot."""

    def close(self, ranks: "DataParallelRanks", deadline: Optional[float] = None) -> None:
        """No step will run again. `deadline`: the time.monotonic() by which closing should be done (work that
        can be cut short, such as persisting the KV cache, stops there and logs what it left out; None: no bound)."""


_NO_GUARD = contextlib.nullcontext()


class FeatureSet(EngineFeature):
    """The features an engine was built with, called in order at every hook."""

    def __init__(self, features: Sequence[EngineFeature] = (), lower_tiers: Optional[LowerTiers] = None) -> None:
        self.features = list(features)
        self.lower_tiers = lower_tiers
        """The KV tiers below the device, as the schedulers' prefix cache sees them (None: off)."""
        # NOTE: the per-step hooks call only the features that override them (the advisor is on by default).
        self._guarding = [f for f in self.features if type(f).step_guard is not EngineFeature.step_guard]
        self._watching_launches = [f for f in self.features if type(f).after_launch is not EngineFeature.after_launch]
        self._watching_steps = [f for f in self.features if type(f).after_step is not EngineFeature.after_step]

    def find(self, kind: type) -> Optional[EngineFeature]:
        """The feature of type `kind`, if on."""
        return next((feature for feature in self.features if isinstance(feature, kind)), None)

    def after_warmup(self, ranks: "DataParallelRanks") -> None:
        for feature in self.features:
            feature.after_warmup(ranks)

    def on_add(self, group: "RequestGroup", dp_rank: int, ranks: "DataParallelRanks") -> None:
        for feature in self.features:
            feature.on_add(group, dp_rank, ranks)

    @contextlib.contextmanager
    def _nested_guards(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for feature in self._guarding:
                stack.enter_context(feature.step_guard())
            yield

    def step_guard(self) -> contextlib.AbstractContextManager[None]:
        return self._nested_guards() if self._guarding else _NO_GUARD

    def after_launch(self, pending: "PendingSample") -> None:
        for feature in self._watching_launches:
            feature.after_launch(pending)

    def after_step(self, ranks: "DataParallelRanks") -> None:
        for feature in self._watching_steps:
            feature.after_step(ranks)

    def on_idle(self) -> None:
        for feature in self.features:
            feature.on_idle()

    def on_reset(self) -> None:
        for feature in self.features:
            feature.on_reset()

    def add_stats(self, stats: "EngineStats", ranks: "DataParallelRanks") -> None:
        for feature in self.features:
            feature.add_stats(stats, ranks)

    def close(self, ranks: "DataParallelRanks", deadline: Optional[float] = None) -> None:
        for feature in self.features:
            feature.close(ranks, deadline)
