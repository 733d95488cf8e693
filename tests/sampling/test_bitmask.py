"""The step's bitmask carries the constrained rows only: masking with (bitmask, rows) padded to a bucket is masking
each listed row with its own words and leaving every other row as it was; the buckets cover every row count."""

import numpy as np
import pytest

from jaxpaged.sampling.bitmask import MIN_CONSTRAINED_ROWS, apply_token_bitmask, constrained_row_buckets


def allowed_of(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """The reference: bit t % 32 of word t // 32 allows token t."""
    bits = (words[:, :, None] >> np.arange(32, dtype=np.int32)) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].astype(bool)


@pytest.mark.parametrize("num_rows, constrained_rows", [(16, [3]), (16, [15, 0, 7]), (32, list(range(32))),
                                                        (64, [63, 1])])
def test_only_the_listed_rows_are_masked_each_by_its_own_words(num_rows, constrained_rows):
    vocab_size = 100  # not a multiple of 32: the last word's high bits are past the vocabulary
    rng = np.random.default_rng(num_rows + len(constrained_rows))
    logits = rng.standard_normal((num_rows, vocab_size)).astype(np.float32)
    size = next(size for size in constrained_row_buckets(num_rows) if size >= len(constrained_rows))
    words = rng.integers(-2**31, 2**31, size=(size, 4), dtype=np.int64).astype(np.int32)
    rows = np.full(size, num_rows, np.int32)
    rows[:len(constrained_rows)] = constrained_rows

    masked = np.asarray(apply_token_bitmask(logits, words, rows))

    expected = logits.copy()
    for index, row in enumerate(constrained_rows):
        expected[row] = np.where(allowed_of(words[index:index + 1], vocab_size)[0], logits[row], -np.inf)
    np.testing.assert_array_equal(masked, expected)


@pytest.mark.parametrize("num_rows", [1, 7, 8, 16, 24, 256, 512])
def test_the_buckets_grow_by_doubling_and_end_at_the_row_count(num_rows):
    buckets = constrained_row_buckets(num_rows)
    assert buckets[-1] == num_rows and buckets == sorted(set(buckets))
    assert all(size >= MIN_CONSTRAINED_ROWS and size & (size - 1) == 0 for size in buckets[:-1])
