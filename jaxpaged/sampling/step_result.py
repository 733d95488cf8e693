"""StepResult: what one engine step hands back to the host, as plain Python and numpy (no device arrays)."""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np
from jaxtyping import Float32, Int32


@dataclasses.dataclass(frozen=True)
class SampledLogprobs:
    """Logprobs of the step's sampled rows, pulled to the host only when some request asked for them."""

    sampled: Float32[np.ndarray, " num_rows"]
    """log_softmax of the raw logits at each row's sampled token."""
    top_ids: Optional[Int32[np.ndarray, "num_rows num_top"]] = None
    """Ids of each row's most likely tokens, best first; None when no row asked for top logprobs."""
    top_values: Optional[Float32[np.ndarray, "num_rows num_top"]] = None
    """Their logprobs, best first."""
    sampled_ranks: Optional[Int32[np.ndarray, " num_rows"]] = None
    """Exact 1-based rank of each row's sampled token (vLLM's: tokens at least as likely, itself included)."""

    def row(self, row: int, num_top: int) -> tuple[float, list[tuple[int, float]], Optional[int]]:
        """(the sampled token's logprob, the row's top num_top (id, logprob) pairs, the sampled token's rank)."""
        top: list[tuple[int, float]] = []
        if self.top_ids is not None and self.top_values is not None and num_top:
            top = list(zip(self.top_ids[row, :num_top].tolist(), self.top_values[row, :num_top].tolist()))
        rank = None if self.sampled_ranks is None else int(self.sampled_ranks[row])
        return float(self.sampled[row]), top, rank


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One token per sampling request of the step, in the order of SchedulerOutput.scheduled."""

    token_ids: list[int]
    """The sampled ids; empty when no scheduled request reached the end of its known tokens."""
    logprobs: Optional[SampledLogprobs] = None
    """Row j belongs to token_ids[j]; None when no sampled request asked for logprobs."""
    prompt_logprobs: Sequence[Any] = ()
    """PromptLogprobEntry objects (sampling/prompt_logprobs.py) of the prompt tokens this step scored."""
    failed_requests: Mapping[str, Exception] = dataclasses.field(default_factory=dict)
    """Sample id -> the exception its host work for the sampler raised (its row was sampled as a padded one, and
    its token means nothing): the engine fails those requests alone."""


NOTHING_SAMPLED = StepResult(token_ids=[])
