"""Request: token bookkeeping, derived counts, lifecycle status and finish reasons."""

from jaxpaged.core import Request, RequestStatus


def test_new_request_state():
    request = Request("a", (5, 6, 7), max_tokens=3, stop_token_ids=[9, 9], sampling_params={"temperature": 0.0},
                      arrival_time=12.5, priority=2, cache_salt="s")
    assert request.prompt_token_ids == [5, 6, 7] and request.all_token_ids == [5, 6, 7]
    assert request.output_token_ids == [] and request.num_computed_tokens == 0 and request.num_cached_tokens == 0
    assert (request.num_tokens, request.num_prompt_tokens, request.num_output_tokens) == (3, 3, 0)
    assert request.status is RequestStatus.WAITING and not request.is_finished() and request.finish_reason is None
    assert request.sampling_params == {"temperature": 0.0} and request.stop_token_ids == {9}
    assert (request.arrival_time, request.priority, request.cache_salt) == (12.5, 2, "s")


def test_prompt_is_copied_and_outputs_grow_both_lists():
    prompt = [1, 2]
    request = Request("a", prompt)
    request.append_output_token(3)
    prompt.append(99)
    assert request.prompt_token_ids == [1, 2] and request.output_token_ids == [3]
    assert request.all_token_ids == [1, 2, 3] and (request.num_tokens, request.num_output_tokens) == (3, 1)


def test_finish_reasons():
    expected = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                RequestStatus.FINISHED_ABORTED: "abort", RequestStatus.FINISHED_ERROR: "error",
                RequestStatus.WAITING: None, RequestStatus.RUNNING: None,
                RequestStatus.PREEMPTED: None}
    for status, reason in expected.items():
        request = Request("a", [1])
        request.status = status
        assert request.finish_reason == reason and request.is_finished() == (reason is not None)
        assert status.is_finished() == (reason is not None)


def test_default_arrival_times_increase():
    first, second = Request("a", [1]), Request("b", [1])
    assert first.arrival_time <= second.arrival_time
