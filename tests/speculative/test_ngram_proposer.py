"""N-gram proposals against a brute-force search, worked cases, and the speculator's adaptive policy."""

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpaged.config import SpeculativeConfig
from jaxpaged.core import Request
from jaxpaged.speculative.ngram import NgramIndex, NgramProposer
from jaxpaged.speculative.proposal import ProposalBatch
from jaxpaged.speculative.speculator import (
    MIN_POSITION_ACCEPTANCE,
    PROBE_EVERY,
    RequestSpeculation,
    Speculator,
)
from tests.core.core_helpers import build_scheduler, make_request


def brute_force(tokens: list[int], n_min: int, n_max: int, k: int) -> list[int]:
    """The definition: for the longest n in [n_min, n_max] whose last-n tokens occurred earlier, the k tokens after
    the latest such occurrence, continuing periodically into the proposal itself."""
    for n in range(n_max, n_min - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        starts = [i for i in range(len(tokens) - n) if tokens[i:i + n] == suffix]
        if starts:
            extended = list(tokens)
            start = starts[-1] + n
            for j in range(k):
                extended.append(extended[start + j])
            return extended[len(tokens):]
    return []


def test_worked_cases():
    index = NgramIndex(1, 3)
    assert index.continuation([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]  # "5 6" occurred at 0: 7 8 followed, then 5
    assert NgramIndex(1, 3).continuation([9, 9, 9], 4) == [9, 9, 9, 9]  # a period-1 repeat goes on
    assert NgramIndex(2, 3).continuation([1, 2, 3, 4], 2) == []  # nothing recurs
    assert NgramIndex(1, 1).continuation([4], 2) == []  # one token: nothing before it
    # The longest suffix wins: "1 2 3" occurred followed by 7, "2 3" more recently followed by 8.
    assert NgramIndex(2, 3).continuation([1, 2, 3, 7, 2, 3, 8, 1, 2, 3], 1) == [7]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 3), st.integers(0, 2), st.integers(1, 6),
       st.integers(1, 8))
def test_the_incremental_index_equals_the_brute_force_search_as_tokens_arrive(tokens, n_min, extra, k, num_steps):
    n_max = n_min + extra
    index = NgramIndex(n_min, n_max)
    # Grow the sequence in steps as a request does, asking at each length.
    step = max(1, len(tokens) // num_steps)
    for end in list(range(step, len(tokens), step)) + [len(tokens)]:
        assert index.continuation(tokens[:end], k) == brute_force(tokens[:end], n_min, n_max, k)


def test_the_proposer_keeps_its_index_per_request():
    proposer = NgramProposer(2, 3)
    request = Request("r", [1, 2, 3, 1, 2])
    ((proposals, state),) = proposer.propose(ProposalBatch([request], [2], [None]))
    assert proposals == [3, 1]
    request.append_output_token(3)
    other = Request("o", [4, 4, 4])
    (again, same_state), (other_proposals, _) = proposer.propose(ProposalBatch([request, other], [2, 3],
                                                                               [state, None]))
    assert same_state is state and again == [1, 2]
    assert other_proposals == [4, 4, 4]


def _speculator(**options) -> Speculator:
    return Speculator(SpeculativeConfig(speculative_method="ngram", **options), NgramProposer(1, 3))


def _decoding_requests(scheduler, token_lists: list[list[int]]) -> list[Request]:
    """Requests past their prefill (one step computed every prompt and drew its first token, 0)."""
    requests = [Request(f"r{i}", tokens, max_tokens=20) for i, tokens in enumerate(token_lists)]
    for request in requests:
        scheduler.add_request(request)
    scheduler.update_from_output(scheduler.schedule(), [0] * len(requests))
    return requests


def test_decoding_requests_get_proposals_and_prefilling_ones_do_not():
    scheduler = build_scheduler(max_num_batched_tokens=64, max_spec_tokens_per_step=32)
    decoding = Request("d", [5, 6, 7, 5, 6, 7], max_tokens=20)
    prefilling = make_request("p", 100, first_token=3000)
    scheduler.add_request(decoding)
    scheduler.add_request(prefilling)
    scheduler.update_from_output(scheduler.schedule(), [5])  # d's prompt and first token; p's first chunk
    assert prefilling.num_computed_tokens < prefilling.num_tokens - 1
    _speculator(num_speculative_tokens=3).after_update(scheduler)
    assert decoding.spec_token_ids == [6, 7, 5]  # "7 5" occurred at 2: 6 7 followed, then 5
    assert prefilling.spec_token_ids == []


def test_no_proposals_at_or_above_the_disable_batch_size():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    requests = _decoding_requests(scheduler, [[5, 0, 6, 5, 0] for _ in range(3)])
    _speculator(speculative_disable_by_batch_size=3).after_update(scheduler)
    assert all(request.spec_token_ids == [] for request in requests)
    _speculator(speculative_disable_by_batch_size=4).after_update(scheduler)
    assert any(request.spec_token_ids for request in requests)


def test_waiting_requests_count_toward_the_disable_batch_size():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    requests = _decoding_requests(scheduler, [[5, 0, 6, 5, 0] for _ in range(3)])
    scheduler.add_request(Request("waiting", [1, 2, 3], max_tokens=5))  # admitted at the next schedule()
    speculator = _speculator(speculative_disable_by_batch_size=4)
    assert not speculator.proposes_at(scheduler)
    speculator.after_update(scheduler)
    assert all(request.spec_token_ids == [] for request in requests)


def test_rejections_shrink_the_proposals_to_none_then_a_probe():
    speculator = _speculator(num_speculative_tokens=4)
    state = RequestSpeculation()
    assert speculator._num_to_propose(state) == 4  # optimistic at first
    state.acceptance = 0.5
    expected = max(i for i in range(5) if 0.5 ** i >= MIN_POSITION_ACCEPTANCE)
    assert speculator._num_to_propose(state) == min(4, expected)
    state.acceptance = 0.05
    counts = [speculator._num_to_propose(state) for _ in range(2 * PROBE_EVERY)]
    assert counts.count(1) == 2 and counts.count(0) == 2 * PROBE_EVERY - 2


def test_a_verified_row_updates_the_acceptance_estimate():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    (request,) = _decoding_requests(scheduler, [[5, 6, 7, 0, 5, 6, 7]])  # then 0: "7 0" recurs
    speculator = _speculator(num_speculative_tokens=3)
    speculator.after_update(scheduler)
    proposed = list(request.spec_token_ids)
    output = scheduler.schedule()
    scheduler.update_from_output(output, [proposed[0], 999, 0, 0])  # one of three accepted
    speculator.after_update(scheduler)
    state = request.speculation
    assert abs(state.acceptance - (0.7 + 0.5 * (1 / 3 - 0.7))) < 1e-9
