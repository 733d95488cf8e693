"""Planning a step while the one before is in flight (async scheduling), worked by hand with 4-token blocks."""

from jaxpaged.core import RequestStatus
from tests.core.core_helpers import build_scheduler, chunk_lens, make_request


def _only(output):
    (item,) = output.scheduled
    return item


def test_a_token_in_flight_is_planned_as_a_placeholder_and_lands_in_order():
    scheduler = build_scheduler()
    request = make_request("a", 3, max_tokens=10)  # positions 0..2
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    assert (_only(prefill).token_ids, _only(prefill).sample, request.num_pending_tokens) == ([1000, 1001, 1002],
                                                                                            True, 1)
    # Planned before the prefill's token is known: position 3 is computed from the token in flight.
    ahead = scheduler.schedule()
    item = _only(ahead)
    assert (item.start_position, item.input_in_flight, item.sample, len(item.token_ids)) == (3, True, True, 1)
    assert (request.num_computed_tokens, request.num_pending_tokens) == (4, 2)

    scheduler.update_from_output(prefill, [50])
    assert (request.output_token_ids, request.num_pending_tokens) == ([50], 1)
    # Block 0 (positions 0..3) is full once token 50 is known, though the step computing position 3 is in flight.
    assert len(request.block_hashes) == 1
    scheduler.update_from_output(ahead, [51])
    assert (request.output_token_ids, request.num_pending_tokens, request.num_computed_tokens) == ([50, 51], 0, 4)
    # Back in step: the next plan takes token 51 from the host.
    assert _only(scheduler.schedule()).token_ids == [51]


def test_no_step_is_planned_past_the_token_that_reaches_max_tokens():
    scheduler = build_scheduler()
    request = make_request("a", 2, max_tokens=2)
    scheduler.add_request(request)
    first = scheduler.schedule()  # samples output token 1
    second = scheduler.schedule()  # computes it, samples output token 2 (the last)
    assert len(second.scheduled) == 1
    assert scheduler.schedule().scheduled == []  # token 2 ends the request: nothing to plan
    scheduler.update_from_output(first, [5])
    scheduler.update_from_output(second, [6])
    assert request.status is RequestStatus.FINISHED_LENGTH and request.output_token_ids == [5, 6]


def test_nor_past_max_model_len():
    scheduler = build_scheduler(max_model_len=6)
    request = make_request("a", 5, max_tokens=8)  # the first sampled token is position 5, the last allowed
    scheduler.add_request(request)
    first = scheduler.schedule()
    assert scheduler.schedule().scheduled == []
    scheduler.update_from_output(first, [9])
    assert request.status is RequestStatus.FINISHED_LENGTH


def test_a_request_finished_while_a_step_is_in_flight_drops_that_step_s_token():
    scheduler = build_scheduler()
    request = make_request("a", 3, max_tokens=10, eos_token_id=2)
    scheduler.add_request(request)
    first = scheduler.schedule()
    ahead = scheduler.schedule()
    scheduler.update_from_output(first, [2])  # EOS: finished, its blocks freed
    assert request.status is RequestStatus.FINISHED_STOPPED
    assert scheduler.update_from_output(ahead, [77]) == []
    assert request.output_token_ids == [2] and scheduler.kv_cache_manager.usage == 0.0


def test_preempting_a_request_with_a_token_in_flight_drops_it_for_the_recompute():
    # 3 usable blocks of 4 tokens: "a" (4 tokens) and "b" (7 tokens) fill them; "b" is admitted after "a".
    scheduler = build_scheduler(num_kv_blocks=4)
    a, b = make_request("a", 4, max_tokens=8), make_request("b", 7, first_token=2000, max_tokens=2)
    scheduler.add_request(a)
    scheduler.add_request(b)
    first = scheduler.schedule()
    assert {item.request.request_id for item in first.scheduled} == {"a", "b"}
    # "a" needs a new block for position 4: "b", the latest admitted, is preempted with its token in flight.
    ahead = scheduler.schedule()
    assert ahead.preempted_request_ids == {"b"}
    assert (b.status, b.num_pending_tokens, b.num_computed_tokens) == (RequestStatus.PREEMPTED, 0, 0)
    scheduler.update_from_output(first, [60, 61])
    assert a.output_token_ids == [60] and b.output_token_ids == []  # b samples its first token again later
    scheduler.update_from_output(ahead, [62])
    assert a.output_token_ids == [60, 62]


def test_a_request_admitted_while_a_prompt_step_is_in_flight_shares_the_blocks_it_writes():
    # Steps run in order on the device, so the full blocks a planned step writes are hittable by the next plan,
    # before that step's tokens are back (a burst of requests behind one system prompt would miss it otherwise).
    scheduler = build_scheduler()
    a, b, c = (make_request(request_id, 10, max_tokens=4) for request_id in "abc")  # 2 full blocks + 2 tokens
    scheduler.add_request(a)
    scheduler.add_request(b)
    first = scheduler.schedule()
    # b was looked up in the same plan, before a's blocks were: it computes its whole prompt.
    assert chunk_lens(first) == {"a": 10, "b": 10} and b.num_cached_tokens == 0
    scheduler.add_request(c)
    ahead = scheduler.schedule()

    assert chunk_lens(ahead) == {"a": 1, "b": 1, "c": 2} and c.num_cached_tokens == 8
    a_blocks = scheduler.kv_cache_manager.get_block_ids("a")
    assert scheduler.kv_cache_manager.get_block_ids("c")[:2] == a_blocks[:2]
    scheduler.update_from_output(first, [5, 6])
    scheduler.update_from_output(ahead, [7, 8, 9])
    assert (a.output_token_ids, c.output_token_ids) == ([5, 7], [9])
