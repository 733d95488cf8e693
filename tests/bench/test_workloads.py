"""Workload generators: lengths, token ranges and statistics against their parameters."""

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from jaxpaged.bench.workloads import (
    BenchRequest,
    MultiTurnWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
    ShareGPTWorkload,
    generate_requests,
    group_by_turn,
    lognormal_lens,
    make_workload_spec,
)


def test_random_lengths_cover_the_closed_range_and_tokens_stay_in_range():
    spec = RandomWorkload(num_requests=2000, min_prompt_len=1, max_prompt_len=4, min_output_len=7,
                          max_output_len=9, token_id_low=10, token_id_high=13)
    requests = generate_requests(spec)
    assert len(requests) == 2000
    assert {len(r.prompt_token_ids) for r in requests} == {1, 2, 3, 4}
    assert {r.max_tokens for r in requests} == {7, 8, 9}
    assert {t for r in requests for t in r.prompt_token_ids} == {10, 11, 12}


def test_random_uniform_mean():
    """W1's 32-256 uniform prompt length has mean 144."""
    requests = generate_requests(RandomWorkload(num_requests=4000, min_prompt_len=32, max_prompt_len=256))
    assert abs(np.mean([len(r.prompt_token_ids) for r in requests]) - 144) < 3
    assert all(r.max_tokens == 64 for r in requests)


def test_same_seed_same_requests_other_seed_other_requests():
    a = generate_requests(RandomWorkload(num_requests=5, seed=1))
    assert a == generate_requests(RandomWorkload(num_requests=5, seed=1))
    assert a != generate_requests(RandomWorkload(num_requests=5, seed=2))


def test_sharegpt_lognormal_median_and_sigma():
    """Without clipping in play, the sample median and log-std match the parameters."""
    rng = np.random.default_rng(0)
    lens = lognormal_lens(rng, median=200.0, sigma=0.5, low=1, high=10**6, size=20000)
    assert abs(np.median(lens) / 200.0 - 1) < 0.03
    assert abs(np.std(np.log(lens)) - 0.5) < 0.02


def test_sharegpt_lengths_clipped():
    spec = ShareGPTWorkload(num_requests=3000, prompt_len_median=100, prompt_len_sigma=1.5, output_len_median=50,
                            output_len_sigma=1.5, min_len=4, max_prompt_len=300, max_output_len=120)
    requests = generate_requests(spec)
    prompt_lens = [len(r.prompt_token_ids) for r in requests]
    output_lens = [r.max_tokens for r in requests]
    assert min(prompt_lens) == 4 and max(prompt_lens) == 300  # a wide sigma reaches both clips
    assert min(output_lens) == 4 and max(output_lens) == 120
    # the right tail: the mean is above the median, as in ShareGPT
    assert np.mean(prompt_lens) > np.median(prompt_lens)


@pytest.mark.parametrize("num_prefixes", [1, 2])
def test_shared_prefix_requests_share_their_prefix(num_prefixes):
    spec = SharedPrefixWorkload(num_requests=6, prefix_len=40, num_prefixes=num_prefixes, min_question_len=3,
                                max_question_len=5, output_len=7)
    requests = generate_requests(spec)
    prefixes = [r.prompt_token_ids[:40] for r in requests]
    assert len(set(prefixes)) == num_prefixes
    assert prefixes[0] == prefixes[num_prefixes]
    assert all(43 <= len(r.prompt_token_ids) <= 45 and r.max_tokens == 7 for r in requests)


def test_timestamp_first_variant_only_adds_a_varying_head():
    """head_len puts distinct tokens before the same system prompt and questions (the timestamp-first trap)."""
    options: dict[str, Any] = dict(num_requests=5, prefix_len=40, min_question_len=3, max_question_len=5)
    plain = generate_requests(SharedPrefixWorkload(**options))
    stamped = generate_requests(SharedPrefixWorkload(head_len=6, **options))
    assert [r.prompt_token_ids[6:] for r in stamped] == [r.prompt_token_ids for r in plain]
    assert len({r.prompt_token_ids[:6] for r in stamped}) == 5


def test_visit_rounds_revisit_every_prefix_once_per_round():
    spec = SharedPrefixWorkload(num_requests=9, prefix_len=20, num_prefixes=3, min_question_len=2,
                                max_question_len=4, visit_rounds=True)
    requests = generate_requests(spec)
    rounds = group_by_turn(requests)
    assert rounds == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    for round_indices in rounds:
        assert len({requests[i].prompt_token_ids[:20] for i in round_indices}) == 3
    without = generate_requests(dataclasses.replace(spec, visit_rounds=False))
    assert [r.prompt_token_ids for r in without] == [r.prompt_token_ids for r in requests]
    assert group_by_turn(without) == [list(range(9))]


def test_shared_prefix_of_length_zero():
    requests = generate_requests(SharedPrefixWorkload(num_requests=3, prefix_len=0, min_question_len=1,
                                                      max_question_len=1))
    assert all(len(r.prompt_token_ids) == 1 for r in requests)


def test_multi_turn_history_grows_by_reply_and_question():
    """Turn k's prompt is turn k-1's prompt, a synthetic reply of output_len, then a new question."""
    spec = MultiTurnWorkload(num_conversations=3, num_turns=3, system_prompt_len=5, min_question_len=2,
                             max_question_len=4, output_len=6)
    requests = generate_requests(spec)
    assert spec.num_requests == len(requests) == 9
    by_conversation = {}
    for r in requests:
        by_conversation.setdefault(r.conversation_id, []).append(r)
    for turns in by_conversation.values():
        assert [t.turn for t in turns] == [0, 1, 2]
        for earlier, later in zip(turns, turns[1:]):
            assert later.prompt_token_ids[:len(earlier.prompt_token_ids)] == earlier.prompt_token_ids
            question_len = len(later.prompt_token_ids) - len(earlier.prompt_token_ids) - 6
            assert 2 <= question_len <= 4
    rounds = group_by_turn(requests)
    assert [[requests[i].turn for i in r] for r in rounds] == [[0] * 3, [1] * 3, [2] * 3]


def test_group_by_turn_of_independent_requests_is_one_round():
    requests = [BenchRequest((1,), 1), BenchRequest((2,), 1)]
    assert group_by_turn(requests) == [[0, 1]]


def test_multi_turn_num_requests_is_derived_not_given():
    with pytest.raises(ValueError, match="workload.num_requests"):
        make_workload_spec({"kind": "multi_turn", "num_requests": 5})


@pytest.mark.parametrize("params, field", [
    ({"kind": "random", "num_requests": 0}, "num_requests"),
    ({"kind": "random", "token_id_low": 5, "token_id_high": 5}, "token_id_high"),
    ({"kind": "sharegpt", "prompt_len_sigma": 0}, "prompt_len_sigma"),
    ({"kind": "sharegpt", "prompt_len_median": math.nan}, "prompt_len_median"),
    ({"kind": "sharegpt", "min_len": 600, "max_prompt_len": 512}, "min_len"),
    ({"kind": "shared_prefix", "prefix_len": -1}, "prefix_len"),
    ({"kind": "shared_prefix", "visit_rounds": "yes"}, "visit_rounds"),
    ({"kind": "multi_turn", "num_turns": 0}, "num_turns"),
    ({"kind": "random", "min_output_len": True}, "min_output_len"),
])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ValueError, match=f"workload.{field}"):
        make_workload_spec(params)
