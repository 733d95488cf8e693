"""Recompute preemption (victim per policy, queue placement, no admission in that step) and priority order."""

from jaxpaged.core import RequestStatus
from tests.core.core_helpers import build_scheduler, chunk_lens, make_request, run_step


def test_fcfs_preempts_the_latest_admitted_and_admits_nobody_that_step():
    # 7 usable blocks of 4 tokens: a (2 blocks) + b (2) + c (3) fill the pool after the first step.
    scheduler = build_scheduler(num_kv_blocks=8, block_size=4, max_model_len=32)
    a, b, c = (make_request("a", 8, first_token=0, max_tokens=8), make_request("b", 8, first_token=100, max_tokens=8),
               make_request("c", 12, first_token=200, max_tokens=8))
    for request in (a, b, c):
        scheduler.add_request(request)
    assert chunk_lens(run_step(scheduler)) == {"a": 8, "b": 8, "c": 12}
    scheduler.add_request(make_request("d", 2, first_token=300))  # would fit in the block left over below

    output = run_step(scheduler)  # a and b each need a 3rd block: c goes
    assert chunk_lens(output) == {"a": 1, "b": 1}
    assert output.preempted_request_ids == {"c"}
    assert c.status is RequestStatus.PREEMPTED and c.num_computed_tokens == 0 and c.num_preemptions == 1
    assert c.output_token_ids == [7]  # generated tokens survive; their K/V is recomputed
    assert scheduler.kv_cache_manager.get_block_ids("c") == []
    assert scheduler.kv_cache_manager.num_free_blocks == 1
    assert [request.request_id for request in scheduler.waiting] == ["c", "d"]
    stats = scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_preemptions) == (2, 2, 1)

    output = scheduler.schedule()  # no preemption now, but c (head of the queue) does not fit: d waits too
    assert chunk_lens(output) == {"a": 1, "b": 1} and output.preempted_request_ids == set()


def test_preempted_request_recomputes_its_generated_tokens_from_position_zero():
    scheduler = build_scheduler(num_kv_blocks=5, block_size=4, max_model_len=16, enable_prefix_caching=False)
    first = make_request("first", 4, first_token=0, max_tokens=12)    # can grow to all 4 blocks
    second = make_request("second", 4, first_token=100, max_tokens=8)
    scheduler.add_request(first)
    scheduler.add_request(second)
    for step in range(5):  # 1 block each, then 2 each (pool full) while decoding positions 4..7
        output = run_step(scheduler, sampled_token_id=step + 1)
        assert chunk_lens(output) == {"first": 1 if step else 4, "second": 1 if step else 4}
    output = run_step(scheduler, sampled_token_id=6)  # first needs a 3rd block: second (latest) goes
    assert output.preempted_request_ids == {"second"} and chunk_lens(output) == {"first": 1}
    assert second.output_token_ids == [1, 2, 3, 4, 5] and second.status is RequestStatus.PREEMPTED
    while scheduler.get_request("first") is not None:
        output = run_step(scheduler, sampled_token_id=6)
        assert chunk_lens(output) == {"first": 1}  # second does not fit back in until first is done
    assert first.finish_reason == "length" and first.num_tokens == 16

    output = scheduler.schedule()
    assert output.finished_request_ids == {"first"}
    (resumed,) = output.scheduled
    assert resumed.request is second and resumed.start_position == 0 and resumed.sample
    assert resumed.token_ids == [100, 101, 102, 103, 1, 2, 3, 4, 5]
    scheduler.update_from_output(output, [9])
    assert second.output_token_ids == [1, 2, 3, 4, 5, 9] and second.status is RequestStatus.RUNNING


def test_priority_preempts_the_lowest_priority_even_behind_the_current_request():
    scheduler = build_scheduler(num_kv_blocks=8, block_size=4, max_model_len=32, scheduling_policy="priority")
    a = make_request("a", 8, first_token=0, priority=1, max_tokens=8)
    b = make_request("b", 8, first_token=100, priority=5, max_tokens=8)
    c = make_request("c", 12, first_token=200, priority=0, max_tokens=8)
    for request in (a, b, c):
        scheduler.add_request(request)
    first = run_step(scheduler)
    assert [scheduled.request.request_id for scheduled in first.scheduled] == ["c", "a", "b"]
    output = run_step(scheduler)  # c needs a 4th block: b (priority 5) goes, not the last admitted
    assert output.preempted_request_ids == {"b"} and chunk_lens(output) == {"c": 1, "a": 1}


def test_priority_victim_already_scheduled_this_step_gives_its_tokens_back():
    scheduler = build_scheduler(num_kv_blocks=6, block_size=4, max_model_len=32, scheduling_policy="priority")
    low = make_request("low", 4, first_token=0, priority=9, max_tokens=12, arrival_time=1.0)
    scheduler.add_request(low)
    run_step(scheduler)                                  # low: 1 block
    scheduler.add_request(make_request("high", 7, first_token=100, priority=0, max_tokens=9, arrival_time=2.0))
    scheduler.add_request(make_request("tail", 1, first_token=200, priority=0, max_tokens=4, arrival_time=3.0))
    assert chunk_lens(run_step(scheduler)) == {"low": 1, "high": 7, "tail": 1}  # 2 + 2 + 1 blocks: pool full
    assert chunk_lens(run_step(scheduler)) == {"low": 1, "high": 1, "tail": 1}  # all inside their last block
    output = run_step(scheduler)  # low is scheduled first, then high needs a 3rd block: low goes
    assert output.preempted_request_ids == {"low"}
    assert chunk_lens(output) == {"high": 1, "tail": 1} and output.num_scheduled_tokens == 2
    assert low.num_computed_tokens == 0 and low.output_token_ids == [7, 7, 7]


def test_no_request_is_admitted_in_a_step_that_preempted():
    scheduler = build_scheduler(num_kv_blocks=8, block_size=4, max_model_len=32, scheduling_policy="priority")
    for first_token, (request_id, num_prompt_tokens, priority) in enumerate([("a", 8, 0), ("b", 8, 0), ("c", 12, 2)]):
        scheduler.add_request(make_request(request_id, num_prompt_tokens, first_token=100 * first_token,
                                           priority=priority, max_tokens=8))
    run_step(scheduler)  # 2 + 2 + 3 blocks: pool full
    scheduler.add_request(make_request("d", 2, first_token=900, priority=1))  # needs 1 block, heads the queue
    output = run_step(scheduler)  # a and b each need a block: c (priority 2) goes, one block is left over
    assert output.preempted_request_ids == {"c"} and chunk_lens(output) == {"a": 1, "b": 1}
    assert scheduler.kv_cache_manager.num_free_blocks == 1
    assert chunk_lens(run_step(scheduler)) == {"a": 1, "b": 1, "d": 2}


def test_fcfs_ties_and_equal_priorities_fall_back_to_the_latest_admitted():
    scheduler = build_scheduler(num_kv_blocks=5, block_size=4, max_model_len=32, scheduling_policy="priority")
    for index in range(2):
        scheduler.add_request(make_request(f"r{index}", 8, first_token=100 * index, arrival_time=1.0, max_tokens=8))
    run_step(scheduler)
    assert run_step(scheduler).preempted_request_ids == {"r1"}


def test_waiting_requests_are_admitted_in_priority_then_arrival_order():
    scheduler = build_scheduler(max_num_seqs=1, scheduling_policy="priority")
    for request_id, priority, arrival_time in [("low", 5, 1.0), ("high-late", 0, 3.0), ("mid", 1, 0.5),
                                               ("high-early", 0, 2.0)]:
        scheduler.add_request(make_request(request_id, 3, priority=priority, arrival_time=arrival_time, max_tokens=1))
    order = [run_step(scheduler).scheduled[0].request.request_id for _ in range(4)]
    assert order == ["high-early", "high-late", "mid", "low"]


def test_fcfs_admits_in_arrival_order_whatever_the_priority():
    scheduler = build_scheduler(max_num_seqs=1)
    for request_id, priority in [("first", 5), ("second", 0), ("third", 1)]:
        scheduler.add_request(make_request(request_id, 3, priority=priority, max_tokens=1))
    assert [run_step(scheduler).scheduled[0].request.request_id for _ in range(3)] == ["first", "second", "third"]
