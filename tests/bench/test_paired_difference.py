"""The quality guard's paired comparison: the accuracy difference of two models over the same questions, its standard
error from the per-question pairs, and the questions lost and gained, on a case worked by hand."""

import math
import statistics

import pytest

from benchmarks.quantization.paired_difference import paired_difference


def test_a_hand_worked_case():
    # Ten questions: the reference gets 6 right; the candidate loses questions 0 and 1 and gains question 6.
    reference = [True] * 6 + [False] * 4
    candidate = [False, False, True, True, True, True, True, False, False, False]
    result = paired_difference(reference, candidate)
    assert (result.lost, result.gained, result.num_questions) == (2, 1, 10)
    assert (result.reference_accuracy, result.candidate_accuracy) == (0.6, 0.5)
    assert result.difference == pytest.approx(-0.1)
    # d = (-1, -1, 0, 0, 0, 0, +1, 0, 0, 0): sum d^2 = 3, sample variance (3 - 10 * 0.1^2) / 9 = 2.9 / 9,
    # standard error sqrt(2.9 / 90) = 0.17951.
    assert result.difference_stderr == pytest.approx(math.sqrt(2.9 / 90))
    assert result.difference_stderr == pytest.approx(0.17951, abs=1e-5)
    d = [int(c) - int(r) for r, c in zip(reference, candidate)]
    assert result.difference_stderr == pytest.approx(statistics.stdev(d) / math.sqrt(len(d)))


def test_identical_answers_differ_by_zero_with_zero_error_and_the_pairs_are_tighter_than_either_accuracy():
    answers = [i % 4 != 0 for i in range(1000)]
    same = paired_difference(answers, answers)
    assert (same.difference, same.difference_stderr, same.lost, same.gained) == (0.0, 0.0, 0, 0)
    # Two flips out of 1,000: each accuracy's own error is ~1.4 points, the paired one ~0.14.
    flipped = list(answers)
    flipped[1], flipped[0] = False, True
    result = paired_difference(answers, flipped)
    assert (result.lost, result.gained, result.difference) == (1, 1, 0.0)
    accuracy_stderr = statistics.stdev(map(float, answers)) / math.sqrt(len(answers))
    assert result.difference_stderr < accuracy_stderr / 5


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="candidate"):
        paired_difference([True, False], [True])
    with pytest.raises(ValueError, match="reference"):
        paired_difference([True], [True])
