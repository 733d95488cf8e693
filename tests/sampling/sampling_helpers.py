"""Rows, logits and one sampling call, shared by the sampler's tests."""

import jax
import numpy as np

from jaxpaged.sampling.params import SamplingParams
from jaxpaged.sampling.sampler import SamplingRow, build_sampling_batch, sample, sampler_static_flags

VOCAB_SIZE = 64
NUM_ROWS = 8


def random_logits(num_rows: int, vocab_size: int = VOCAB_SIZE, seed: int = 0, scale: float = 2.0):
    return (np.random.default_rng(seed).standard_normal((num_rows, vocab_size)) * scale).astype(np.float32)


def row(seed: int = 0, prompt=(1, 2, 3), output=(), suppress=(), **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), seed, list(prompt), list(output), list(suppress))


def row_with_unchecked_seed(seed: object) -> SamplingRow:
    """A row whose seed is not an int (a NamedTuple does not check types), so the builder's validation is what
    rejects it."""
    return row()._replace(seed=seed)


def run(rows, logits, num_rows_padded: int = NUM_ROWS):
    """Builds the batch, picks its flags and samples; returns numpy outputs and the flags."""
    batch = build_sampling_batch(rows, num_rows_padded, logits.shape[1])
    flags = sampler_static_flags(batch)
    output = jax.device_get(sample(logits, batch, flags))
    return output, flags
