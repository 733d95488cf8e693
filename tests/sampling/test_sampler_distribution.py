"""The sampler's draws follow the filtered softmax (chi-square over seeds and steps), and its top-k / top-p
thresholds keep exactly what a sorting reference keeps."""

import numpy as np
import pytest

from jaxpaged.sampling.sampler import SamplingRow
from tests.sampling.sampling_helpers import VOCAB_SIZE, row, run

PROBS = np.array([0.1, 0.2, 0.3, 0.4])
CHI_SQUARE_CRITICAL_AT_0_1_PERCENT = {1: 10.83, 2: 13.82, 3: 16.27}
NUM_DRAWS = 800


def _expected(weights):
    weights = np.asarray(weights, np.float64)
    return weights / weights.sum()


DISTRIBUTION_CASES = {
    "random": [(dict(temperature=1.0), PROBS), (dict(temperature=0.5), _expected(PROBS ** 2)),
               (dict(temperature=2.0), _expected(PROBS ** 0.5)),
               (dict(min_p=0.6), _expected([0, 0, 0.3, 0.4]))],
    "top_k_top_p": [(dict(top_k=2), _expected([0, 0, 0.3, 0.4])), (dict(top_p=0.6), _expected([0, 0, 0.3, 0.4])),
                    (dict(top_p=0.75), _expected([0, 0.2, 0.3, 0.4])), (dict(temperature=1.0), PROBS),
                    (dict(top_k=3, top_p=0.95, temperature=0.5), _expected([0, 0.04, 0.09, 0.16]))],
}


def _draw_rows(case: int, params: dict) -> list[SamplingRow]:
    """NUM_DRAWS rows of one case: half vary the seed at step 0, half are one seed at successive steps."""
    by_seed = [row(seed=case * 100_000 + draw, **params) for draw in range(NUM_DRAWS // 2)]
    by_step = [row(seed=case, output=[0] * draw, **params) for draw in range(NUM_DRAWS // 2)]
    return by_seed + by_step


@pytest.mark.parametrize("mode", sorted(DISTRIBUTION_CASES))
def test_sampling_distribution_matches_the_filtered_softmax(mode):
    """800 draws per case (400 seeds, 400 steps of one seed) on a 4-token vocabulary pass a chi-square test;
    filtered-out tokens never come."""
    cases = DISTRIBUTION_CASES[mode]
    rows = [r for case, (params, _) in enumerate(cases) for r in _draw_rows(case, params)]
    logits = np.tile(np.log(PROBS).astype(np.float32), (4096, 1))
    output, flags = run(rows, logits, num_rows_padded=4096)
    assert flags.mode == mode
    for case, (params, expected) in enumerate(cases):
        allowed = expected > 0
        draws = output.token_ids[case * NUM_DRAWS:(case + 1) * NUM_DRAWS]
        for half in (draws[:NUM_DRAWS // 2], draws[NUM_DRAWS // 2:]):
            counts = np.bincount(half, minlength=4)
            assert np.all(counts[~allowed] == 0), (params, counts)
            expected_counts = expected[allowed] * len(half)
            chi_square = float(np.sum((counts[allowed] - expected_counts) ** 2 / expected_counts))
            assert chi_square < CHI_SQUARE_CRITICAL_AT_0_1_PERCENT[int(allowed.sum()) - 1], (params, counts)


def _reference_top_k_top_p(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Which tokens top_k then top_p keep, by a sort in float64 (ties at the cut all kept)."""
    order = np.argsort(-logits, kind="stable")
    sorted_logits = logits[order]
    k = top_k if top_k > 0 else len(logits)
    kth_value = sorted_logits[k - 1]
    head = sorted_logits[sorted_logits >= kth_value].astype(np.float64)
    probs = np.exp(head - head.max())
    probs /= probs.sum()
    mass_before = np.cumsum(probs) - probs
    num_kept = len(head) if top_p >= 1.0 else int(np.sum(mass_before < top_p))
    return logits >= head[num_kept - 1]


def test_top_k_top_p_thresholds_match_a_sorting_reference():
    """The bisection thresholds keep exactly the tokens a sort keeps, with ties, -inf and negative logits."""
    from jaxpaged.sampling.sampler import _apply_top_k_top_p

    rng = np.random.default_rng(11)
    num_rows = 64
    logits = np.round(rng.standard_normal((num_rows, VOCAB_SIZE)) * 3, 1).astype(np.float32)  # many ties
    logits[::7, :5] = -np.inf
    logits[1::5] -= 50.0  # all negative
    top_ks = rng.choice([0, 1, 2, 5, 17, VOCAB_SIZE - 1], num_rows).astype(np.int32)
    top_ps = rng.choice([1.0, 0.999, 0.9, 0.5, 0.1, 1e-6], num_rows).astype(np.float32)
    # Neighbouring floats, one ulp apart: only an exact threshold splits them right.
    logits[2:4] = np.float32(1.0) + np.arange(VOCAB_SIZE, dtype=np.float32) * np.spacing(np.float32(1.0))
    top_ks[2:4], top_ps[2:4] = (5, 0), (1.0, 0.5)
    filtered = np.asarray(_apply_top_k_top_p(logits, top_ks, top_ps))
    for i in range(num_rows):
        expected = _reference_top_k_top_p(logits[i], int(top_ks[i]), float(top_ps[i]))
        np.testing.assert_array_equal(np.isfinite(filtered[i]), expected & np.isfinite(logits[i]),
                                      err_msg=f"row {i}: top_k={top_ks[i]} top_p={top_ps[i]}")
        np.testing.assert_array_equal(filtered[i][expected], logits[i][expected])
