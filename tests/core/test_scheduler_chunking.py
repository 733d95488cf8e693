"""The token-budget loop: chunk sizes, positions, block tables, sample flags, admission limits and prefix hits."""

import pytest

from jaxpaged.core import Request
from tests.core.core_helpers import build_scheduler, chunk_lens, make_request, run_step


def prefill_chunks(scheduler, request_id):
    """Chunk sizes of one request's prefill, step by step, until it samples."""
    chunks = []
    while True:
        output = run_step(scheduler)
        chunks.append(chunk_lens(output)[request_id])
        if output.scheduled[0].sample:
            return chunks


@pytest.mark.parametrize("num_prompt_tokens, budget, threshold, expected_chunks", [
    (1, 16, 0, [1]),
    (15, 16, 0, [15]),
    (16, 16, 0, [16]),
    (17, 16, 0, [16, 1]),
    (100, 32, 0, [32, 32, 32, 4]),
    (100, 64, 20, [20, 20, 20, 20, 20]),
    (50, 64, 64, [50]),
    (45, 16, 30, [16, 16, 13]),
])
def test_prefill_chunk_sizes(num_prompt_tokens, budget, threshold, expected_chunks):
    scheduler = build_scheduler(max_num_batched_tokens=budget, max_num_seqs=1, long_prefill_token_threshold=threshold)
    scheduler.add_request(make_request("a", num_prompt_tokens))
    assert prefill_chunks(scheduler, "a") == expected_chunks


def test_scheduled_tokens_positions_blocks_and_sample_flags():
    scheduler = build_scheduler(max_num_batched_tokens=8, block_size=4)
    request = make_request("a", 10)
    scheduler.add_request(request)
    first = scheduler.schedule()
    (chunk,) = first.scheduled
    assert chunk.token_ids == list(range(1000, 1008)) and chunk.start_position == 0 and not chunk.sample
    assert chunk.block_ids == [1, 2] and first.num_scheduled_tokens == 8
    assert request.num_computed_tokens == 8  # advanced by schedule()
    assert scheduler.update_from_output(first, []) == []
    second = scheduler.schedule()
    (chunk,) = second.scheduled
    assert chunk.token_ids == [1008, 1009] and chunk.start_position == 8 and chunk.sample
    assert chunk.block_ids == [1, 2, 3]
    assert scheduler.update_from_output(second, [42]) == [request]
    assert request.output_token_ids == [42] and request.all_token_ids[-3:] == [1008, 1009, 42]
    (decode,) = scheduler.schedule().scheduled
    assert decode.token_ids == [42] and decode.start_position == 10 and decode.sample


def test_running_requests_come_first_and_waiting_ones_take_the_rest_of_the_budget():
    scheduler = build_scheduler(max_num_batched_tokens=16)
    scheduler.add_request(make_request("a", 10, first_token=0))
    scheduler.add_request(make_request("b", 20, first_token=100))
    scheduler.add_request(make_request("c", 3, first_token=200))
    assert chunk_lens(run_step(scheduler)) == {"a": 10, "b": 6}
    output = run_step(scheduler)
    assert [scheduled.request.request_id for scheduled in output.scheduled] == ["a", "b", "c"]
    assert chunk_lens(output) == {"a": 1, "b": 14, "c": 1}
    assert chunk_lens(run_step(scheduler)) == {"a": 1, "b": 1, "c": 2}


def test_decodes_keep_their_token_while_a_long_prompt_is_chunked():
    """With a threshold, a long prefill never takes the tokens of the decodes running beside it."""
    scheduler = build_scheduler(max_num_batched_tokens=16, long_prefill_token_threshold=8, max_model_len=512)
    for index in range(4):
        scheduler.add_request(make_request(f"short-{index}", 2, first_token=10 * index, max_tokens=50))
    run_step(scheduler)
    scheduler.add_request(make_request("long", 200, first_token=1000))
    for _ in range(10):
        lens = chunk_lens(run_step(scheduler))
        assert [lens[f"short-{index}"] for index in range(4)] == [1, 1, 1, 1]
        assert lens["long"] == 8


def test_max_num_seqs_limits_admission():
    scheduler = build_scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    for index in range(3):
        scheduler.add_request(make_request(f"r{index}", 4, first_token=10 * index))
    output = run_step(scheduler)
    assert set(chunk_lens(output)) == {"r0", "r1"} and scheduler.num_running == 2 and scheduler.num_waiting == 1


def test_admission_waits_for_free_blocks_in_order():
    """The head of the waiting queue is not overtaken by a smaller request behind it."""
    scheduler = build_scheduler(num_kv_blocks=5, block_size=4, max_model_len=16)  # 4 usable blocks
    scheduler.add_request(make_request("a", 9, first_token=0, max_tokens=1))    # 3 blocks
    scheduler.add_request(make_request("b", 8, first_token=100, max_tokens=1))  # 2 blocks: does not fit yet
    scheduler.add_request(make_request("c", 2, first_token=200, max_tokens=1))  # 1 block: would fit
    output = run_step(scheduler)
    assert set(chunk_lens(output)) == {"a"} and scheduler.num_waiting == 2
    assert output.scheduled[0].request.is_finished()
    assert chunk_lens(run_step(scheduler)) == {"b": 8, "c": 2}


def test_prefix_hit_request_starts_at_the_hit():
    scheduler = build_scheduler(block_size=4)
    shared = list(range(10))
    scheduler.add_request(Request("first", shared + [50]))
    run_step(scheduler)
    second = Request("second", shared + [60, 61])
    scheduler.add_request(second)
    output = run_step(scheduler)
    scheduled = [s for s in output.scheduled if s.request is second][0]
    assert scheduled.start_position == 8 and scheduled.token_ids == [8, 9, 60, 61] and scheduled.sample
    assert scheduled.block_ids[:2] == scheduler.kv_cache_manager.get_block_ids("first")[:2]
    assert second.num_cached_tokens == 8
    stats = scheduler.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (11 + 12, 8)


def test_requests_admitted_in_the_same_step_do_not_hit_each_other():
    """Blocks are hittable once their step ran (update_from_output), not while being computed."""
    scheduler = build_scheduler(block_size=4)
    scheduler.add_request(Request("a", list(range(12))))
    scheduler.add_request(Request("b", list(range(12))))
    output = run_step(scheduler)
    assert [s.start_position for s in output.scheduled] == [0, 0]
    scheduler.add_request(Request("c", list(range(12))))
    output = run_step(scheduler)
    # c shares a's blocks 0-1 and copies tokens 8-10 of a's block 2 (token-granular; its last token is computed).
    assert [s.start_position for s in output.scheduled] == [12, 12, 11]
    a_blocks, c_blocks = (scheduler.kv_cache_manager.get_block_ids(r) for r in ("a", "c"))
    assert c_blocks[:2] == a_blocks[:2] and output.block_copies == [(a_blocks[2], c_blocks[2])]


def test_prefix_caching_disabled_computes_everything():
    scheduler = build_scheduler(enable_prefix_caching=False)
    scheduler.add_request(Request("a", list(range(12))))
    run_step(scheduler)
    scheduler.add_request(Request("b", list(range(12))))
    assert run_step(scheduler).scheduled[-1].start_position == 0
    assert scheduler.stats().prefix_cache_queries == 0



@pytest.mark.parametrize("granularity, expected_hit", [("block", 992), ("token", 1000)])
def test_second_request_with_a_shared_1000_token_prefix(granularity, expected_hit):
    """vLLM's 992 of 1,000 on 16-token blocks; token-granular, the finished first request's last, partly filled
    block supplies the other 8 tokens by a copy."""
    scheduler = build_scheduler(block_size=16, num_kv_blocks=200, max_num_batched_tokens=512, max_model_len=2048,
                                prefix_caching_granularity=granularity)
    prefix = list(range(1000))
    first = Request("first", prefix + [5001, 5002], max_tokens=1)
    scheduler.add_request(first)
    while scheduler.has_unfinished_requests():
        run_step(scheduler)
    second = Request("second", prefix + [6001, 6002, 6003])
    scheduler.add_request(second)
    output = run_step(scheduler)
    assert second.num_cached_tokens == expected_hit and output.scheduled[0].start_position == expected_hit
    assert first.num_cached_tokens == 0
    assert len(output.block_copies) == (expected_hit % 16 > 0)
    stats = scheduler.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (1002 + 1003, expected_hit)


def test_a_copy_hit_that_needs_one_block_too_many_is_computed_instead():
    # One usable block of 2 tokens. A finished [0] leaves its partly filled block listed as a copy source; copying
    # it into [0, 0]'s own block would hold two blocks, so the head of the queue used to wait forever for a block
    # nobody would free (found by the stateful test). It computes the token instead.
    scheduler = build_scheduler(num_kv_blocks=2, block_size=2, max_num_seqs=1, max_num_batched_tokens=1,
                                max_model_len=2)
    scheduler.add_request(Request("one", [0], max_tokens=1))
    run_step(scheduler)
    assert not scheduler.has_unfinished_requests()
    longer = Request("two", [0, 0], max_tokens=1)
    scheduler.add_request(longer)

    assert chunk_lens(run_step(scheduler)) == {"two": 1}
    assert chunk_lens(run_step(scheduler)) == {"two": 1}
    assert longer.num_cached_tokens == 0 and longer.output_token_ids == [7] and not scheduler.has_unfinished_requests()
