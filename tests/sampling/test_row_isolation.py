"""The sampling row table on the host: top_k clamped to the vocabulary before numpy sees it, and a row whose
values cannot be packed recorded and padded (the engine fails that request alone) instead of failing the batch."""

import dataclasses

import numpy as np
import pytest

from jaxpaged.engine.request_failures import SystemicFaultError, check_not_systemic, describe
from jaxpaged.sampling.batch import build_sampling_batch
from tests.sampling.sampling_helpers import NUM_ROWS, VOCAB_SIZE, row, row_with_unchecked_seed


@pytest.mark.parametrize("top_k,expected", [
    (-1, 0), (0, 0), (1, 1), (VOCAB_SIZE - 1, VOCAB_SIZE - 1), (VOCAB_SIZE, 0), (VOCAB_SIZE + 1, 0),
    (2**31, 0), (2**63, 0), (10**309, 0)])
def test_top_k_edge_values_in_the_row_table(top_k, expected):
    """The row's top_k as the sampler gets it: -1 and 0 are off, and so is anything >= the vocabulary (10**309
    included: it overflowed float64 and raised for the whole batch; 2**31 wrapped to garbage in int32)."""
    batch = build_sampling_batch([row(temperature=1.0, top_k=top_k)], NUM_ROWS, VOCAB_SIZE)
    assert batch.top_ks.dtype == np.int32 and batch.top_ks.tolist() == [expected] + [0] * (NUM_ROWS - 1)


def _fields(batch) -> dict:
    return {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}


@pytest.mark.parametrize("penalties", [False, True])
def test_a_failing_row_is_recorded_and_padded_and_the_others_are_unchanged(penalties):
    """A row that cannot be packed (here a seed that is no int) lands in row_errors and is packed as a padded row;
    every other row's values equal those of a batch built without it."""
    extra = dict(repetition_penalty=1.3, logit_bias={5: 2.0}) if penalties else {}
    good = [row(seed=3, temperature=0.7, top_k=5, logprobs=2, output=[1, 4], **extra),
            row(seed=9, temperature=0.0, top_p=0.5)]
    row_errors: dict[int, Exception] = {}
    batch = build_sampling_batch([good[0], row_with_unchecked_seed("x"), good[1]], NUM_ROWS, VOCAB_SIZE, row_errors)
    assert list(row_errors) == [1] and str(row_errors[1]).startswith("seed:")
    padded = build_sampling_batch([], NUM_ROWS, VOCAB_SIZE)
    reference = build_sampling_batch([good[0], good[0], good[1]], NUM_ROWS, VOCAB_SIZE)
    for name, value in _fields(batch).items():
        if value is None:
            assert getattr(reference, name) is None, name
            continue
        np.testing.assert_array_equal(value[[0, 2]], getattr(reference, name)[[0, 2]], err_msg=name)
        expected_padding = getattr(padded, name)
        if expected_padding is None:  # a dense penalty array: the failed row adds and penalizes nothing
            assert not np.any(value[1]), name
        else:
            np.testing.assert_array_equal(value[1], expected_padding[1], err_msg=name)


def test_without_row_errors_a_failing_row_raises():
    """The builder alone (tests, warm-up) still raises, naming the field."""
    with pytest.raises(ValueError, match="^seed: row 1"):
        build_sampling_batch([row(), row_with_unchecked_seed(None)], NUM_ROWS, VOCAB_SIZE)


class _Sample:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


class _Table:
    """RequestTable's `samples` mapping, sample id -> (group, sample), as check_not_systemic reads it."""

    def __init__(self, sample_ids_by_request: dict[str, list[str]]) -> None:
        self.samples = {sample_id: (_Sample(request_id), None)
                        for request_id, sample_ids in sample_ids_by_request.items() for sample_id in sample_ids}


def test_every_request_failing_with_one_fault_is_systemic():
    """Two requests or more, each failing with the same exception type: the loop is broken, raise."""
    table = _Table({"a": ["a"], "b": ["b"]})
    with pytest.raises(SystemicFaultError, match="every one of the step's 2 requests: OverflowError"):
        check_not_systemic({"a": OverflowError("x"), "b": OverflowError("y")}, ["a", "b"], table)  # type: ignore[arg-type]


@pytest.mark.parametrize("failures,step", [
    ({"a": OverflowError()}, ["a"]),                                     # one request alone: its own fault
    ({"a#0": OverflowError(), "a#1": OverflowError()}, ["a#0", "a#1"]),  # n samples of one request
    ({"a": OverflowError()}, ["a", "b"]),                                # another request went on
    ({"a": OverflowError(), "b": KeyError()}, ["a", "b"]),               # different faults
])
def test_a_fault_short_of_every_request_is_not_systemic(failures, step):
    """One request failing (alone, or with its n samples), or different faults, never stops the loop."""
    table = _Table({"a": ["a", "a#0", "a#1"], "b": ["b"]})
    check_not_systemic(failures, step, table)  # type: ignore[arg-type]


def test_describe_caps_the_message():
    """An error's text in a client's error body is "Type: message", at most 500 characters and an ellipsis."""
    assert describe(ValueError("top_k: bad")) == "ValueError: top_k: bad"
    assert len(describe(RuntimeError("x" * 10_000))) == 503
