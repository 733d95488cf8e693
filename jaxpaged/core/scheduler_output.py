"""What one schedule() call hands the model runner: per request, the tokens whose K/V this step computes."""

import dataclasses

from .hashing import BlockHash
from .request import Request


@dataclasses.dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step."""

    request: Request
    """The request itself (read-only for the runner)."""
    token_ids: list[int]
    """The tokens whose K/V this step computes: a prefill chunk, or the one newest token of a decode."""
    start_position: int
    """Position of token_ids[0]: the request's num_computed_tokens before this step."""
    block_ids: list[int]
    """The request's block table, covering start_position + len(token_ids) tokens; may be a live reference,
    valid until the next schedule()."""
    sample: bool
    """This step reaches the end of the request's known tokens, so its next token is sampled."""
    input_in_flight: bool = False
    """Async scheduling: token_ids is [a placeholder] for the token the step still in flight samples for this
    request; the runner feeds that step's sampled id to this one on the device."""
    num_spec_tokens: int = 0
    """Speculative decoding: the last num_spec_tokens of token_ids are proposals, not known tokens. The row samples
    at each of its last 1 + num_spec_tokens positions; update_from_output keeps the proposals the samples confirm."""
    group_block_ids: tuple[list[int], ...] = ()
    """KV layer groups (core/kv_cache_groups.py): the request's block table of every group (block_ids is group
    0's); () with one group."""


@dataclasses.dataclass
class SchedulerOutput:
    """One engine step: what to compute, and which requests left since the previous step."""

    scheduled: list[ScheduledRequest]
    """In order; requests that were already running come first, newly admitted ones after."""
    num_scheduled_tokens: int
    """Sum of len(token_ids) over scheduled; never above max_num_batched_tokens."""
    finished_request_ids: set[str]
    """Requests finished or aborted since the previous schedule(): the runner may drop their state."""
    preempted_request_ids: set[str]
    """Requests preempted by this schedule(): their blocks are gone, they restart from position 0 later."""
    block_copies: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    """(source, destination) blocks to copy, every layer's K/V, before the step runs: token-granular prefix hits
    (copy-on-write of a partly matching block)."""
    kv_saves: list[tuple[int, BlockHash]] = dataclasses.field(default_factory=list)
    """(block, chain hash) of cached blocks this schedule evicted from the device pool: their K/V goes down to the
    lower KV tiers before anything else runs (the step may overwrite them)."""
    kv_loads: list[tuple[int, object]] = dataclasses.field(default_factory=list)
    """(block, payload) of lower-tier prefix hits: loaded after the saves, before the block copies and the step."""

    @property
    def num_sampled_requests(self) -> int:
        """How many scheduled requests sample a token."""
        return sum(1 for scheduled_request in self.scheduled if scheduled_request.sample)

    @property
    def num_sampled_rows(self) -> int:
        """How many token rows sample (the length update_from_output expects): one per sampling request, plus one
        per proposal it verifies."""
        return sum(1 + item.num_spec_tokens for item in self.scheduled if item.sample)
