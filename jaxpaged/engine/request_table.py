"""RequestTable: the engine's unfinished requests, by request id and by sample id."""

from typing import Optional

from jaxpaged.engine.requests import RequestGroup, Sample


class RequestTable:
    """Every unfinished request group, the owner of each sample id, the data-parallel rank a group runs on, the
    groups holding samples back (n > 1) and those whose next token needs the last one on the host."""

    def __init__(self) -> None:
        self.groups: dict[str, RequestGroup] = {}
        """Request id -> its group, while unfinished."""
        self.samples: dict[str, tuple[RequestGroup, Sample]] = {}
        """Sample id (the scheduler's request id) -> its group and sample."""
        self.dp_rank_of: dict[str, int] = {}
        """Request id -> the data-parallel rank all its samples run on."""
        self.needs_tokens_on_host: set[str] = set()
        """Requests whose next token depends on the last one on the host (a grammar, output penalties): while any
        is unfinished, the overlapped loop dispatches a step's sampler only once the step before has applied its
        tokens (the model still runs ahead)."""
        self._holding_back: dict[str, RequestGroup] = {}
        """Groups (n > 1) whose later samples wait for the first one's prefill; the only ones a step checks."""

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.groups

    def __bool__(self) -> bool:
        return bool(self.groups)

    def add(self, group: RequestGroup, dp_rank: int, needs_tokens_on_host: bool) -> None:
        """Track a group whose first sample the scheduler of data-parallel rank `dp_rank` holds."""
        self.groups[group.request_id] = group
        self.dp_rank_of[group.request_id] = dp_rank
        if len(group.samples) > 1:
            self._holding_back[group.request_id] = group
        for sample in group.samples:
            self.samples[sample.request.request_id] = (group, sample)
        if needs_tokens_on_host:
            self.needs_tokens_on_host.add(group.request_id)

    def release_held_back(self) -> list[tuple[int, Sample]]:
        """The held-back samples whose first sample has computed the prompt, with their data-parallel rank; marked
        released."""
        released = []
        for request_id, group in list(self._holding_back.items()):
            if group.ready_to_release():
                released += [(self.dp_rank_of[request_id], held) for held in group.held_back()]
                group.num_released = len(group.samples)
                del self._holding_back[request_id]
        return released

    def forget(self, request_id: str) -> Optional[RequestGroup]:
        """Stop tracking a request (finished or aborted); its group, or None if unknown."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return None
        self.dp_rank_of.pop(request_id, None)
        self._holding_back.pop(request_id, None)
        self.needs_tokens_on_host.discard(request_id)
        for sample in group.samples:
            self.samples.pop(sample.request.request_id, None)
        return group
