"""row_argmax (the sampler's two-level argmax) against numpy's argmax: the first index of the maximum, NaN first."""

import jax
import numpy as np
import pytest

from jaxpaged.sampling.sampler import row_argmax

row_argmax_jit = jax.jit(row_argmax)


def check(values: np.ndarray) -> np.ndarray:
    """row_argmax of values, checked against numpy's argmax; returned for the hand-worked answers."""
    got = np.asarray(row_argmax_jit(values))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argmax(values, axis=-1))
    return got


@pytest.mark.parametrize("width", [1, 2, 127, 128, 129, 255, 256, 1000, 128 * 40])
def test_random_rows_of_every_width_around_the_block(width):
    rng = np.random.default_rng(width)
    check(rng.standard_normal((7, width)).astype(np.float32))


def test_ties_take_the_first_index_within_and_across_blocks():
    values = np.zeros((5, 512), np.float32)
    values[0, [3, 70, 400]] = 5.0          # three maxima, two in block 0
    values[1, [200, 130]] = 5.0            # both in block 1: the lower one
    values[2, [127, 128]] = 5.0            # the last column of block 0 against the first of block 1
    values[3, [511, 384]] = 5.0            # both in the last block
    values[4] = 1.0                        # every entry ties: index 0
    np.testing.assert_array_equal(check(values), [3, 130, 127, 384, 0])


def test_nan_counts_as_the_maximum_like_argmax():
    values = np.random.default_rng(0).standard_normal((4, 300)).astype(np.float32)
    values[0, 5] = np.inf
    values[0, 250] = np.nan                # NaN beats +inf
    values[1, [260, 140]] = np.nan         # the first NaN, in a later block than the row's largest number
    values[2, 299] = np.nan                # in the padded last block
    values[3, 0] = np.nan
    np.testing.assert_array_equal(check(values), [250, 140, 299, 0])


def test_infinities_signed_zeros_and_padding():
    values = np.full((4, 200), -np.inf, np.float32)  # 200: the last block is padded with -inf
    values[1, 150] = -1e30                 # the only finite entry, in the padded block
    values[2, [60, 190]] = np.inf
    values[3, :] = -1.0
    values[3, [10, 170]] = [-0.0, 0.0]     # equal maxima: the first
    np.testing.assert_array_equal(check(values), [0, 150, 60, 10])


def test_no_rows():
    assert row_argmax_jit(np.zeros((0, 256), np.float32)).shape == (0,)
