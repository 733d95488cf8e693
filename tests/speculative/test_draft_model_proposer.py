"""The draft-model proposer's host side against a stand-in draft whose next token depends on every token before it,
read back from the K/V slots the proposer's block tables point at: a proposal equals the definition (the draft's
greedy continuation of the request's tokens) only if catch-up, chunking, rollback and block bookkeeping are right."""

import random
from collections.abc import Sequence

import pytest

from jaxpaged.core import Request
from jaxpaged.core.scheduler_output import ScheduledRequest
from jaxpaged.speculative.draft_model import DraftModelProposer
from jaxpaged.speculative.proposal import ProposalBatch

BLOCK_SIZE = 4
VOCAB = 50


def next_token(context: list[int]) -> int:
    """The stand-in draft: a deterministic function of the whole context."""
    return (sum((i + 1) * t for i, t in enumerate(context)) * 7 + len(context)) % VOCAB


def continuation(tokens: list[int], count: int) -> list[int]:
    """The definition of a draft proposal: greedy, one token after another."""
    context = list(tokens)
    for _ in range(count):
        context.append(next_token(context))
    return context[len(tokens):]


class SlotDraft:
    """Writes each scheduled token into its slot; a sampling item's next token reads its whole context back from
    the slots of its block table (a stale, misplaced or missing token changes it)."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.slots: dict[int, int] = {}
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.num_steps = 0

    def warmup(self) -> float:
        return 0.0

    def greedy(self, scheduled: Sequence[ScheduledRequest]) -> list[int]:
        assert 0 < len(scheduled) <= self.max_num_seqs
        assert sum(len(item.token_ids) for item in scheduled) <= self.max_num_batched_tokens
        self.num_steps += 1
        sampled = []
        for item in scheduled:
            assert 0 not in item.block_ids  # the null block is never handed out
            end = item.start_position + len(item.token_ids)
            for position, token_id in enumerate(item.token_ids, item.start_position):
                self.slots[self._slot(item.block_ids, position)] = token_id
            if item.sample:
                sampled.append(next_token([self.slots[self._slot(item.block_ids, p)] for p in range(end)]))
        return sampled

    @staticmethod
    def _slot(block_ids: list[int], position: int) -> int:
        return block_ids[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE


def _proposer(num_blocks: int = 64, max_num_seqs: int = 3, budget: int = 16,
              max_model_len: int = 200) -> DraftModelProposer:
    return DraftModelProposer(SlotDraft(max_num_seqs, budget), num_blocks, BLOCK_SIZE, max_num_seqs, budget,
                              max_model_len)


def _propose(proposer: DraftModelProposer, requests: list[Request], counts: list[int]) -> list[list[int]]:
    return [p for p, _ in proposer.propose(ProposalBatch(requests, counts, [None] * len(requests)))]


def test_proposals_follow_the_definition_through_catch_up_rollback_and_chunking():
    # Prompts of 1, a block +- 1 and several budgets' worth (chunked over steps); 5 requests > 3 per step.
    rng = random.Random(0)
    proposer = _proposer()
    requests = [Request(f"r{i}", [rng.randrange(VOCAB) for _ in range(n)], max_tokens=150)
                for i, n in enumerate([1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 45])]
    for _ in range(12):
        counts = [rng.randint(1, 4) for _ in requests]
        proposals = _propose(proposer, requests, counts)
        for request, count, proposed in zip(requests, counts, proposals):
            assert proposed == continuation(request.all_token_ids, count)
            # The target keeps some proposals and draws its own token after them (sometimes not the draft's).
            num_accepted = rng.randint(0, count)
            for token_id in proposed[:num_accepted]:
                request.append_output_token(token_id)
            request.append_output_token(rng.randrange(VOCAB))


def test_no_proposal_past_max_tokens_or_max_model_len():
    proposer = _proposer(max_model_len=12)
    near_length_limit = Request("a", list(range(9)), max_tokens=3)  # 9 + 3 = 12 tokens: room to verify 2
    near_max_tokens = Request("b", [1, 2], max_tokens=2)
    near_max_tokens.append_output_token(5)  # one more token allowed: nothing to verify
    assert _propose(proposer, [near_length_limit, near_max_tokens], [4, 4]) == \
        [continuation(near_length_limit.all_token_ids, 2), []]
    assert "b" not in proposer.sequences  # nothing computed for it


def test_requests_that_stop_running_give_their_blocks_back():
    proposer = _proposer(num_blocks=20)
    requests = [Request(f"r{i}", list(range(10 + i)), max_tokens=50) for i in range(3)]
    _propose(proposer, requests, [3, 3, 3])
    assert proposer.pool.num_free_blocks < 19
    proposer.retain(requests[1:])  # r0 finished or was preempted
    assert set(proposer.sequences) == {"r1", "r2"}
    reused = Request("r1", [7, 7, 7], max_tokens=5)  # a new request under a finished one's id
    proposer.retain([reused])
    assert set(proposer.sequences) == set() and proposer.pool.num_free_blocks == 19
    assert _propose(proposer, [reused], [2]) == [continuation([7, 7, 7], 2)]


def test_a_full_pool_evicts_requests_that_do_not_propose_now_then_gives_up():
    # 1 + 4 blocks: one request of up to 16 positions at a time.
    proposer = _proposer(num_blocks=5)
    first, second = Request("a", list(range(12)), max_tokens=50), Request("b", list(range(20, 32)), max_tokens=50)
    assert _propose(proposer, [first], [3]) == [continuation(first.all_token_ids, 3)]
    assert _propose(proposer, [second], [3]) == [continuation(second.all_token_ids, 3)]  # a evicted for it
    assert set(proposer.sequences) == {"b"}
    # Both propose now: b keeps its blocks, a finds none free and proposes nothing this time.
    assert _propose(proposer, [first, second], [3, 3]) == [[], continuation(second.all_token_ids, 3)]


@pytest.mark.parametrize("budget, max_num_seqs", [(1, 1), (5, 2), (64, 8)])
def test_catch_up_steps_stay_within_the_draft_step_limits(budget, max_num_seqs):
    proposer = _proposer(budget=budget, max_num_seqs=max_num_seqs)
    requests = [Request(f"r{i}", list(range(i, i + 9)), max_tokens=20) for i in range(4)]
    assert _propose(proposer, requests, [2] * 4) == [continuation(r.all_token_ids, 2) for r in requests]
