"""A chi-square test of homogeneity: do two engines' sampled outputs come from one distribution?"""

import collections

import numpy as np

CHI2_CRITICAL_AT_0_001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
"""The chi-square distribution's 0.999 quantile by degrees of freedom: a false alarm once in a thousand runs."""


def assert_same_distribution(counts: list[collections.Counter]) -> None:
    """Two tallies of outcomes (e.g. output token tuples) drawn from the same distribution, at the 0.001 level, over
    the outcomes drawn at least 10 times in all (chi-square needs populated cells)."""
    outcomes = sorted(set(counts[0]) | set(counts[1]))
    table = np.array([[c[o] for o in outcomes] for c in counts])
    table = table[:, table.sum(axis=0) >= 10]
    assert table.shape[1] >= 2
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    statistic = float(((table - expected) ** 2 / expected).sum())
    assert statistic < CHI2_CRITICAL_AT_0_001[table.shape[1] - 1], (table, statistic)
