"""Every stop condition, aborts and engine-side finishes, and what update_from_output returns."""

import pytest

from jaxpaged.core import RequestStatus
from tests.core.core_helpers import build_scheduler, make_request


def generate(scheduler, request, sampled_token_ids):
    """Feed the request one token per step until it finishes or the tokens run out; tokens consumed."""
    scheduler.add_request(request)
    num_consumed = 0
    while not request.is_finished() and num_consumed < len(sampled_token_ids):
        output = scheduler.schedule()
        if output.num_sampled_requests:
            scheduler.update_from_output(output, [sampled_token_ids[num_consumed]])
            num_consumed += 1
        else:
            scheduler.update_from_output(output, [])
    return num_consumed


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_max_tokens(max_tokens):
    scheduler = build_scheduler()
    request = make_request("a", 3, max_tokens=max_tokens)
    assert generate(scheduler, request, list(range(10))) == max_tokens
    assert request.status is RequestStatus.FINISHED_LENGTH and request.finish_reason == "length"
    assert request.output_token_ids == list(range(max_tokens)) and request.stop_reason is None


def test_eos_stops_and_is_kept_as_the_last_output_token():
    scheduler = build_scheduler()
    request = make_request("a", 3, eos_token_id=2, max_tokens=10)
    generate(scheduler, request, [5, 6, 2, 8])
    assert request.output_token_ids == [5, 6, 2] and request.finish_reason == "stop" and request.stop_reason is None


def test_ignore_eos_runs_to_max_tokens():
    scheduler = build_scheduler()
    request = make_request("a", 3, eos_token_id=2, ignore_eos=True, max_tokens=4)
    generate(scheduler, request, [2, 2, 2, 2, 2])
    assert request.output_token_ids == [2, 2, 2, 2] and request.finish_reason == "length"


def test_stop_token_ids_set_stop_reason():
    scheduler = build_scheduler()
    request = make_request("a", 3, stop_token_ids=[11, 12], max_tokens=10)
    generate(scheduler, request, [5, 12, 11])
    assert request.output_token_ids == [5, 12] and request.finish_reason == "stop" and request.stop_reason == 12


def test_stop_tokens_are_ignored_before_min_tokens():
    scheduler = build_scheduler()
    request = make_request("a", 3, eos_token_id=2, stop_token_ids=[11], min_tokens=3, max_tokens=10)
    generate(scheduler, request, [2, 11, 2, 11])
    assert request.output_token_ids == [2, 11, 2] and request.finish_reason == "stop"


def test_eos_as_the_last_allowed_token_finishes_stop():
    scheduler = build_scheduler()
    request = make_request("a", 3, eos_token_id=2, max_tokens=2)
    generate(scheduler, request, [5, 2])
    assert request.finish_reason == "stop"


@pytest.mark.parametrize("num_prompt_tokens, expected_num_output_tokens", [(10, 2), (11, 1), (12, 1), (1, 11)])
def test_max_model_len_caps_prompt_plus_output(num_prompt_tokens, expected_num_output_tokens):
    """Generation stops once prompt + output reaches max_model_len; a prompt of exactly max_model_len samples one."""
    scheduler = build_scheduler(max_model_len=12)
    request = make_request("a", num_prompt_tokens, max_tokens=100)
    generate(scheduler, request, [5] * 100)
    assert request.num_output_tokens == expected_num_output_tokens and request.finish_reason == "length"


def test_update_returns_requests_that_received_a_token_and_frees_finished_ones():
    scheduler = build_scheduler(max_num_batched_tokens=16, block_size=4)
    done = make_request("done", 4, first_token=0, max_tokens=1)
    chunked = make_request("chunked", 30, first_token=100)
    scheduler.add_request(done)
    scheduler.add_request(chunked)
    output = scheduler.schedule()
    assert [s.sample for s in output.scheduled] == [True, False]
    assert scheduler.update_from_output(output, [9]) == [done]
    assert done.is_finished() and scheduler.get_request("done") is None
    assert scheduler.kv_cache_manager.get_block_ids("done") == [] and scheduler.num_running == 1
    assert scheduler.schedule().finished_request_ids == {"done"}


def test_update_rejects_a_wrong_number_of_sampled_tokens():
    scheduler = build_scheduler()
    scheduler.add_request(make_request("a", 3))
    output = scheduler.schedule()
    with pytest.raises(ValueError, match="sampled_token_ids"):
        scheduler.update_from_output(output, [1, 2])
    request = scheduler.get_request("a")
    assert request is not None and request.output_token_ids == []


def test_abort_frees_at_once_and_is_reported_by_the_next_step():
    scheduler = build_scheduler()
    running, waiting = make_request("running", 8, first_token=0), make_request("waiting", 8, first_token=100)
    scheduler.add_request(running)
    scheduler.update_from_output(scheduler.schedule(), [1])
    scheduler.add_request(waiting)
    scheduler.finish_requests(["running", "waiting", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert running.finish_reason == "abort" and waiting.finish_reason == "abort"
    assert scheduler.kv_cache_manager.usage == 0.0 and not scheduler.has_unfinished_requests()
    output = scheduler.schedule()
    assert output.scheduled == [] and output.finished_request_ids == {"running", "waiting"}
    assert scheduler.schedule().finished_request_ids == set()


def test_finish_between_schedule_and_update_skips_the_request():
    """A stop string found by the engine, or an abort, while a step is in flight."""
    scheduler = build_scheduler()
    first, second = make_request("first", 3, first_token=0), make_request("second", 3, first_token=100)
    scheduler.add_request(first)
    scheduler.add_request(second)
    output = scheduler.schedule()
    scheduler.finish_requests("first", RequestStatus.FINISHED_STOPPED)
    assert scheduler.update_from_output(output, [4, 5]) == [second]
    assert first.output_token_ids == [] and first.finish_reason == "stop" and second.output_token_ids == [5]


def test_finish_requests_needs_a_finished_status():
    scheduler = build_scheduler()
    scheduler.add_request(make_request("a", 3))
    with pytest.raises(ValueError, match="status"):
        scheduler.finish_requests(["a"], RequestStatus.RUNNING)
    request = scheduler.get_request("a")
    assert request is not None and request.status is RequestStatus.WAITING


def test_a_finished_id_can_be_reused():
    scheduler = build_scheduler()
    generate(scheduler, make_request("a", 3, max_tokens=1), [1])
    scheduler.add_request(make_request("a", 3))
    assert scheduler.num_waiting == 1
