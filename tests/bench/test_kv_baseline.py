"""The contiguous-reservation baseline, against hand-worked traces."""

import pytest

from jaxpaged.bench.kv_baseline import contiguous_baseline


def test_hand_worked_two_requests():
    """A: prompt 10, 2 tokens; B: prompt 20, 3 tokens; 100 slots, max_model_len 50.

    Step 0 both prefill (live 10 + 20), step 1 both decode (11 + 21), A is done; step 2 B alone (22).
    Live = 30 + 32 + 22 = 84. Reserved with max_model_len: 100 + 100 + 50 = 250; with prompt + max_tokens
    (A 12, B 23): 35 + 35 + 23 = 93.
    """
    by_max_len = contiguous_baseline([10, 20], [2, 3], 100, 50, 8, "max_model_len")
    assert by_max_len.max_concurrent_requests == 2 and by_max_len.num_steps == 3
    assert by_max_len.kv_utilization_mean == pytest.approx(84 / 250)
    by_request = contiguous_baseline([10, 20], [2, 3], 100, 50, 8, "request")
    assert by_request.max_concurrent_requests == 2
    assert by_request.kv_utilization_mean == pytest.approx(84 / 93)


def test_capacity_for_one_max_model_len_runs_requests_one_at_a_time():
    result = contiguous_baseline([10, 20], [2, 3], 99, 50, 8, "max_model_len")
    assert result.max_concurrent_requests == 1
    assert result.num_steps == 2 + 3
    # A: steps live 10, 11; B: 20, 21, 22 -> 84 live over 5 steps of 50 reserved slots
    assert result.kv_utilization_mean == pytest.approx(84 / 250)


def test_fcfs_head_blocks_later_requests():
    """A big request at the head waits for room; the small one behind it may not overtake."""
    result = contiguous_baseline([40, 50, 1], [1, 1, 1], 100, 60, 8, "request")
    # reservations A 41 + B 51 + C 2 = 94 <= 100: all three at once
    assert result.max_concurrent_requests == 3
    blocked = contiguous_baseline([40, 58, 1], [1, 1, 1], 100, 60, 8, "request")
    # A 41 + B 59 = 100 fits exactly; C waits for a later step
    assert blocked.max_concurrent_requests == 2 and blocked.num_steps == 2


def test_max_num_seqs_caps_concurrency():
    assert contiguous_baseline([1] * 10, [1] * 10, 1000, 10, 3, "request").max_concurrent_requests == 3


def test_one_token_outputs_take_one_step_each_and_use_every_reserved_slot_but_one():
    result = contiguous_baseline([7], [1], 8, 8, 1, "request")
    assert result.num_steps == 1
    assert result.kv_utilization_mean == pytest.approx(7 / 8)


@pytest.mark.parametrize("args, field", [
    (([10], [2], 100, 50, 8, "paged"), "reservation"),
    (([10], [2, 3], 100, 50, 8, "request"), "output_lens"),
    (([0], [2], 100, 50, 8, "request"), "prompt_lens"),
    (([49], [2], 100, 50, 8, "request"), "prompt_lens"),
    (([10], [2], 40, 50, 8, "max_model_len"), "capacity_tokens"),
])
def test_bad_input_names_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        contiguous_baseline(*args)
