"""SamplingParams validation: every field, its boundary values accepted and just-outside values rejected."""

import dataclasses
import math

import pytest

from jaxpaged.sampling.params import MAX_INT32, MAX_LOGPROBS, MAX_N, MAX_STOP_TOKEN_IDS, SamplingParams

NAN, INF = math.nan, math.inf


def test_defaults_match_vllm():
    """The defaults are vLLM's: one sample of 16 tokens at temperature 1, every filter and penalty off."""
    params = SamplingParams()
    assert (params.n, params.temperature, params.top_p, params.top_k, params.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.0, 0.0, 1.0)
    assert params.seed is None and params.logit_bias is None and params.logprobs is None
    assert (params.stop, params.stop_token_ids) == ([], [])
    assert (params.max_tokens, params.min_tokens) == (16, 0)
    assert not params.ignore_eos and not params.include_stop_str_in_output and params.skip_special_tokens
    assert not params.is_greedy and params.output_kind == "cumulative"


ACCEPTED = [
    ("n", 1), ("n", 64), ("n", MAX_N),
    ("temperature", 0.0), ("temperature", 0), ("temperature", 1e-6), ("temperature", 2.0), ("temperature", 100.0),
    ("top_p", 1.0), ("top_p", 1e-9), ("top_p", 0.5), ("top_p", 1),
    ("top_k", 0), ("top_k", -1), ("top_k", 1), ("top_k", 50), ("top_k", 10**6), ("top_k", 2**31), ("top_k", 10**309),
    ("min_p", 0.0), ("min_p", 1.0), ("min_p", 0.05),
    ("seed", None), ("seed", 0), ("seed", -5), ("seed", 2**64 - 1), ("seed", -(2**63)),
    ("presence_penalty", -2.0), ("presence_penalty", 2.0), ("presence_penalty", 0),
    ("frequency_penalty", -2.0), ("frequency_penalty", 2.0), ("frequency_penalty", 1.5),
    ("repetition_penalty", 1e-3), ("repetition_penalty", 1.0), ("repetition_penalty", 5.0),
    ("repetition_penalty", 1e-4), ("repetition_penalty", 1e4), ("temperature", 3e38), ("top_p", 1.2e-38),
    ("logit_bias", None), ("logit_bias", {}), ("logit_bias", {0: -100.0, 7: 100.0, 3: 0}),
    ("stop", None), ("stop", "###"), ("stop", ["a", "bc"]), ("stop", [str(i) for i in range(64)]),
    ("stop", "x" * 1024),
    ("stop_token_ids", None), ("stop_token_ids", []), ("stop_token_ids", [0, 2, 49151]),
    ("stop_token_ids", [MAX_INT32]), ("stop_token_ids", list(range(MAX_STOP_TOKEN_IDS))),
    ("include_stop_str_in_output", True),
    ("max_tokens", 1), ("max_tokens", 10**6), ("max_tokens", MAX_INT32),
    ("min_tokens", 0), ("min_tokens", 16),
    ("ignore_eos", True),
    ("logprobs", None), ("logprobs", 0), ("logprobs", 1), ("logprobs", MAX_LOGPROBS),
    ("skip_special_tokens", False),
    ("output_kind", "cumulative"), ("output_kind", "final_only"),
]


@pytest.mark.parametrize("field,value", ACCEPTED)
def test_accepts_boundary_and_typical_values(field, value):
    """Values on the edge of each allowed range construct without error."""
    SamplingParams(**{field: value})


REJECTED = [
    ("n", 0), ("n", -1), ("n", 1.0), ("n", True), ("n", None), ("n", MAX_N + 1), ("n", 10**309),
    ("temperature", -1e-9), ("temperature", NAN), ("temperature", INF), ("temperature", "1"),
    ("temperature", True), ("temperature", None), ("temperature", 1e39), ("temperature", 10**309),
    ("temperature", 1e-300),
    ("top_p", 0.0), ("top_p", -0.1), ("top_p", 1.0000001), ("top_p", NAN), ("top_p", INF), ("top_p", False),
    ("top_k", -2), ("top_k", -(10**309)), ("top_k", 1.0), ("top_k", True), ("top_k", None),
    ("min_p", -1e-9), ("min_p", 1.0000001), ("min_p", NAN), ("min_p", INF),
    ("seed", 1.0), ("seed", True), ("seed", "42"), ("seed", 2**64), ("seed", -(2**63) - 1), ("seed", 10**309),
    ("top_p", 1e-300),
    ("presence_penalty", -2.0000001), ("presence_penalty", 2.0000001), ("presence_penalty", NAN),
    ("presence_penalty", INF),
    ("frequency_penalty", -2.0000001), ("frequency_penalty", 2.0000001), ("frequency_penalty", NAN),
    ("frequency_penalty", -INF),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", NAN),
    ("repetition_penalty", INF), ("repetition_penalty", 1e-45), ("repetition_penalty", 9e-5),
    ("repetition_penalty", 1.0001e4), ("repetition_penalty", 10**309),
    ("logit_bias", {0: NAN}), ("logit_bias", {0: -INF}), ("logit_bias", {"9" * 5000: 1.0}),
    ("logit_bias", {10**5000: 1.0}), ("logit_bias", {2**31: 1.0}), ("logit_bias", {"\u00b2": 1.0}),
    ("logit_bias", {0: INF}), ("logit_bias", {-1: 1.0}), ("logit_bias", {1.0: 1.0}),
    ("logit_bias", {True: 1.0}), ("logit_bias", {"x": 1.0}), ("logit_bias", {"-1": 1.0}),
    ("logit_bias", [(0, 1.0)]), ("logit_bias", {0: "1"}),
    ("stop", ""), ("stop", ["ok", ""]), ("stop", [1]), ("stop", 5), ("stop", [str(i) for i in range(65)]),
    ("stop", "x" * 1025), ("stop", ["ok", "y" * 5000]),
    ("stop_token_ids", [-1]), ("stop_token_ids", [1.0]), ("stop_token_ids", [True]), ("stop_token_ids", 5),
    ("stop_token_ids", [2**31]), ("stop_token_ids", [10**309]), ("stop_token_ids", [0] * (MAX_STOP_TOKEN_IDS + 1)),
    ("include_stop_str_in_output", 1), ("include_stop_str_in_output", None),
    ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", 16.0), ("max_tokens", None), ("max_tokens", True),
    ("min_tokens", -1), ("min_tokens", 17), ("min_tokens", 1.0), ("min_tokens", True), ("min_tokens", 10**309),
    ("max_tokens", MAX_INT32 + 1), ("max_tokens", 10**309),
    ("ignore_eos", 0), ("ignore_eos", "yes"),
    ("logprobs", -1), ("logprobs", MAX_LOGPROBS + 1), ("logprobs", 1.0), ("logprobs", True), ("logprobs", 10**309),
    ("prompt_logprobs", -1), ("prompt_logprobs", MAX_LOGPROBS + 1), ("prompt_logprobs", 2**31),
    ("skip_special_tokens", None), ("skip_special_tokens", 1),
    ("output_kind", "delta"), ("output_kind", None), ("output_kind", 1),
]


@pytest.mark.parametrize("field,value", REJECTED)
def test_rejects_bad_values_naming_the_field(field, value):
    """Each bad value raises a ValueError whose message starts with the field's name."""
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert str(error.value).startswith(field), str(error.value)


def test_min_tokens_may_equal_but_not_exceed_max_tokens():
    """min_tokens <= max_tokens is checked against the max_tokens actually given."""
    SamplingParams(max_tokens=3, min_tokens=3)
    with pytest.raises(ValueError, match="^min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)


def test_normalizes_stop_token_ids_logit_bias_and_floats():
    """stop becomes a list, JSON-style string keys of logit_bias become ints, int floats become floats."""
    params = SamplingParams(stop="END", stop_token_ids=(5, 6),  # pyright: ignore[reportArgumentType]  (on purpose)
                            logit_bias={"12": 3, 4: -1.5},  # pyright: ignore[reportArgumentType]  (JSON-style keys)
                            temperature=0, top_p=1)
    assert params.stop == ["END"] and params.stop_token_ids == [5, 6]
    assert params.logit_bias == {12: 3.0, 4: -1.5}
    assert isinstance(params.temperature, float) and params.is_greedy
    assert isinstance(params.top_p, float)
    assert SamplingParams(temperature=9e-6).is_greedy and not SamplingParams(temperature=1e-5).is_greedy


def test_replace_revalidates():
    """dataclasses.replace (e.g. the engine deriving a per-sample copy) re-runs validation."""
    params = SamplingParams(stop=["x"], logit_bias={1: 2.0}, seed=7)
    copy = dataclasses.replace(params, seed=8)
    assert copy.seed == 8 and copy.stop == ["x"] and copy.logit_bias == {1: 2.0}
    with pytest.raises(ValueError, match="^top_p"):
        dataclasses.replace(params, top_p=0.0)


@pytest.mark.parametrize("vocab_size", [1, 100])
def test_validate_token_ids_accepts_ids_inside_the_vocabulary(vocab_size):
    """The last id of the vocabulary is fine for both stop_token_ids and logit_bias."""
    SamplingParams(stop_token_ids=[0, vocab_size - 1], logit_bias={vocab_size - 1: 1.0}).validate_token_ids(
        vocab_size)
    SamplingParams().validate_token_ids(vocab_size)


@pytest.mark.parametrize("field,kwargs", [
    ("stop_token_ids", {"stop_token_ids": [0, 100]}),
    ("stop_token_ids", {"stop_token_ids": [10**9]}),
    ("logit_bias", {"logit_bias": {100: 1.0}}),
    ("logit_bias", {"logit_bias": {3: 1.0, 250: -1.0}}),
])
def test_validate_token_ids_rejects_ids_past_the_vocabulary(field, kwargs):
    """An id == vocab_size or larger is rejected on the host, naming the field and the id."""
    with pytest.raises(ValueError, match=f"^{field}") as error:
        SamplingParams(**kwargs).validate_token_ids(100)
    assert "100" in str(error.value)


@pytest.mark.parametrize("bias,clamped", [(100.0001, 100.0), (-100.0001, -100.0), (123.456, 100.0), (1e300, 100.0),
                                          (10**309, 100.0), (-(10**309), -100.0), (-5, -5.0), (100, 100.0)])
def test_logit_bias_values_are_clamped_to_plus_minus_100(bias, clamped):
    """Any finite bias is taken and clamped to [-100, 100] (vLLM's handling of OpenAI's range), even an int past
    float64's range."""
    assert SamplingParams(logit_bias={3: bias}).logit_bias == {3: clamped}


def test_a_huge_value_is_named_by_its_size_not_printed():
    """A 5,000-digit int in an error message is described, not printed (printing it raises ValueError itself)."""
    with pytest.raises(ValueError, match="^top_k: .*an int of 16610 bits"):
        SamplingParams(top_k=-(10**5000))
