"""Bad input is a ValueError naming the problem, raised when the request is made or added, and disturbs nothing."""

import pytest

from jaxpaged.core import Request, RequestStatus
from tests.core.core_helpers import build_scheduler, make_request, run_step


@pytest.mark.parametrize("options, field", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"priority": "high"}, "priority"),
    ({"cache_salt": 3}, "cache_salt"),
])
def test_bad_request_fields(options, field):
    with pytest.raises(ValueError, match=field):
        Request("a", [1, 2, 3], **options)


@pytest.mark.parametrize("request_id", ["", None, 7])
def test_request_id_must_be_a_non_empty_string(request_id):
    with pytest.raises(ValueError, match="request_id"):
        Request(request_id, [1])


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("a", [])


def scheduler_with_one_running_request():
    scheduler = build_scheduler(num_kv_blocks=9, block_size=4, max_model_len=64)  # 8 usable blocks
    scheduler.add_request(make_request("running", 5, max_tokens=4))
    run_step(scheduler)
    return scheduler


def snapshot(scheduler):
    running = scheduler.get_request("running")
    return (scheduler.num_running, scheduler.num_waiting, scheduler.stats(), list(running.all_token_ids),
            list(scheduler.kv_cache_manager.get_block_ids("running")), scheduler.kv_cache_manager.num_free_blocks)


@pytest.mark.parametrize("make_bad_request, field", [
    (lambda: make_request("long", 65), "prompt_token_ids"),
    (lambda: make_request("running", 3), "request_id"),
    (lambda: make_request("too-big", 30, max_tokens=5), "max_tokens"),  # 34 K/V tokens > 8 blocks of 4
])
def test_add_request_rejects_and_leaves_the_scheduler_as_it_was(make_bad_request, field):
    scheduler = scheduler_with_one_running_request()
    before = snapshot(scheduler)
    with pytest.raises(ValueError, match=field):
        scheduler.add_request(make_bad_request())
    assert snapshot(scheduler) == before
    running = scheduler.get_request("running")
    assert running is not None and running.status is RequestStatus.RUNNING


def test_max_tokens_lowered_after_construction_is_caught_at_add_time():
    scheduler = build_scheduler()
    request = make_request("a", 3)
    request.max_tokens = 0
    with pytest.raises(ValueError, match="max_tokens"):
        scheduler.add_request(request)
    assert scheduler.num_waiting == 0


@pytest.mark.parametrize("num_prompt_tokens, max_tokens, error_field", [
    (32, 1, None),    # 32 K/V tokens: exactly the 8 usable blocks
    (31, 2, None),    # the last sampled token's K/V is never computed
    (31, 3, "max_tokens"),
    (33, 1, "prompt_token_ids"),
])
def test_pool_capacity_check_counts_the_kv_a_request_can_ever_need(num_prompt_tokens, max_tokens, error_field):
    scheduler = build_scheduler(num_kv_blocks=9, block_size=4, max_model_len=64)
    request = make_request("a", num_prompt_tokens, max_tokens=max_tokens)
    if error_field is None:
        scheduler.add_request(request)
        while scheduler.has_unfinished_requests():
            run_step(scheduler)
        assert request.num_output_tokens == max_tokens
    else:
        with pytest.raises(ValueError, match=error_field):
            scheduler.add_request(request)


def test_a_request_object_is_added_only_once():
    scheduler = build_scheduler()
    request = make_request("a", 3, max_tokens=1)
    scheduler.add_request(request)
    run_step(scheduler)
    with pytest.raises(ValueError, match="request"):
        scheduler.add_request(request)


@pytest.mark.parametrize("num_kv_blocks", [1, 0, 3.0])
def test_scheduler_needs_a_usable_block(num_kv_blocks):
    with pytest.raises(ValueError, match="num_kv_blocks"):
        build_scheduler(num_kv_blocks=num_kv_blocks)
