"""The accuracy difference of two models scored on the same questions, with its paired standard error.

Each model's accuracy has a standard error of about sqrt(p (1 - p) / n) (±1.4 points at 1,000 questions and 75%),
but most questions are answered alike by a model and its quantized copy, so their difference varies far less: per
question d = correct(quantized) - correct(reference) is -1, 0 or +1, and the standard error of mean(d) counts only
the questions that flipped. Sample standard deviations (n - 1), as lm-eval's acc_stderr uses.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedDifference:
    """How a candidate's per-question correctness compares with a reference's over the same questions."""

    num_questions: int
    reference_accuracy: float
    candidate_accuracy: float
    difference: float
    """candidate - reference accuracy (a fraction; negative: the candidate answers fewer correctly)."""
    difference_stderr: float
    """The standard error of `difference` over the per-question pairs."""
    lost: int
    """Questions the reference answers correctly and the candidate does not."""
    gained: int
    """Questions the candidate answers correctly and the reference does not."""


def paired_difference(reference: Sequence[bool], candidate: Sequence[bool]) -> PairedDifference:
    """Compare per-question correctness `candidate` against `reference` (the same questions in the same order)."""
    n = len(reference)
    if n != len(candidate):
        raise ValueError(f"candidate: {len(candidate)} answers for {n} reference answers (the same questions)")
    if n < 2:
        raise ValueError(f"reference: {n} answers; a standard error needs at least 2")
    lost = sum(r and not c for r, c in zip(reference, candidate))
    gained = sum(c and not r for r, c in zip(reference, candidate))
    mean = (gained - lost) / n
    # Each d is -1, 0 or +1, so sum(d^2) = lost + gained.
    variance = (lost + gained - n * mean * mean) / (n - 1)
    return PairedDifference(num_questions=n, reference_accuracy=sum(map(bool, reference)) / n,
                            candidate_accuracy=sum(map(bool, candidate)) / n, difference=mean,
                            difference_stderr=math.sqrt(variance / n), lost=lost, gained=gained)
