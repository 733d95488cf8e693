"""SpecDecodeStats: what speculative decoding proposed and what verification kept, cumulative (for /metrics)."""

import dataclasses


@dataclasses.dataclass
class SpecDecodeStats:
    """Counters of verified proposals, as vLLM's spec_decode metrics count them."""

    num_drafts: int = 0
    """Speculative rows verified (one per request per step that carried proposals)."""
    num_draft_tokens: int = 0
    """Proposed tokens verified."""
    num_accepted_tokens: int = 0
    """Proposed tokens accepted."""
    accepted_per_position: list[int] = dataclasses.field(default_factory=list)
    """accepted_per_position[i]: rows whose proposal i was accepted (so the first i + 1 were)."""
    drafted_per_position: list[int] = dataclasses.field(default_factory=list)
    """drafted_per_position[i]: rows that proposed at least i + 1 tokens."""

    def record(self, num_proposed: int, num_accepted: int) -> None:
        """One verified row: num_proposed tokens proposed, the first num_accepted of them accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        missing = num_proposed - len(self.drafted_per_position)
        if missing > 0:
            self.drafted_per_position += [0] * missing
            self.accepted_per_position += [0] * missing
        for position in range(num_proposed):
            self.drafted_per_position[position] += 1
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1
