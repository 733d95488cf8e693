"""The proposer interface: who proposes after an update gets one batched call, whatever the proposals come from."""

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from jaxpaged.core.request import Request


@dataclasses.dataclass
class ProposalBatch:
    """The requests that propose after one update, in one call: a proposer that runs a model (a draft model; later a
    head reading the target's hidden states, which would come as one more field here) proposes for all of them
    in one batched run."""

    requests: list[Request]
    """Decoding requests whose newest token the target has not computed yet (the proposals follow it)."""
    max_tokens: list[int]
    """Per request: propose at most this many (>= 1)."""
    states: list[Any]
    """Per request: the proposer's state returned for it last time (None the first time)."""


class Proposer(Protocol):
    """Where proposals come from: n-gram lookup (ngram.py) or a draft model (draft_model.py)."""

    def propose(self, batch: ProposalBatch) -> list[tuple[list[int], Any]]:
        """Per request of the batch, in order: up to its max_tokens tokens to follow request.all_token_ids, and the
        proposer's new state for it (kept on the request, handed back next time)."""
        ...

    def warmup(self) -> float:
        """Compile whatever proposing runs (nothing for a host-only proposer); the seconds it took."""
        ...

    def retain(self, running: Sequence[Request]) -> None:
        """Forget whatever the proposer holds for requests not in `running` (finished, aborted or preempted): called
        after every update, before propose."""
        ...
