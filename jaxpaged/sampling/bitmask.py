"""Structured outputs on the device: each constrained row's logits are masked by its grammar's token bitmask
before the sampler runs, so the sampler itself (and its compiled variants) never changes.

A bitmask row is ceil(vocab / 32) int32 words (llguidance's layout: bit t % 32 of word t // 32 allows token t).
Only the constrained rows' masks cross to the device, with their row indices, padded to a few bucket sizes: at
512 rows with 10 % constrained, a full-batch mask was 3 MB to fill with ones and transfer every step, for 51 rows
of real words. The masking function is compiled once per (row bucket, constrained-row bucket) at warm-up and runs
only on steps where some row has a grammar: a step without one pays nothing.
"""

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.core.request import Request
from jaxpaged.sampling.grammar import RequestGrammar, fill_bitmasks


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return -(-vocab_size // 32)


MIN_CONSTRAINED_ROWS = 8
"""The smallest constrained-row bucket: fewer buckets to compile, for at most 7 rows of padding."""


def constrained_row_buckets(num_rows: int) -> list[int]:
    """The constrained-row counts a step of `num_rows` sampling rows pads to: 8, 16, 32, ... below num_rows, then
    num_rows itself."""
    buckets = []
    size = MIN_CONSTRAINED_ROWS
    while size < num_rows:
        buckets.append(size)
        size *= 2
    return buckets + [num_rows]


@jax.jit
def apply_token_bitmask(logits: Float[Array, "num_rows vocab"], bitmask: Int[Array, "num_constrained words"],
                        rows: Int[Array, " num_constrained"]) -> Float[Array, "num_rows vocab"]:
    """-inf on every token of row rows[i] that bitmask[i] does not allow; a padding entry (rows[i] == num_rows)
    changes nothing."""
    num_rows, vocab_size = logits.shape
    bits = (bitmask[:, :, None] >> jnp.arange(32, dtype=jnp.int32)) & 1
    allowed = bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].astype(bool)
    masked = jnp.where(allowed, logits[jnp.minimum(rows, num_rows - 1)], -jnp.inf)
    return logits.at[rows].set(masked, mode="drop")  # NOTE: real rows are distinct; padding ones are dropped


def fill_step_bitmask(requests: Sequence[Request], num_rows_padded: int, vocab_size: int,
                      row_errors: Optional[dict[int, Exception]] = None) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The step's constrained rows as (bitmask, rows): bitmask[i] allows the next tokens of requests[rows[i]];
    padded to a constrained_row_buckets() size with rows == num_rows_padded. None when no request has a grammar
    (nothing to mask). With `row_errors`, a grammar that fails to fill its mask is recorded there by its row in
    `requests` (its row stays all-allowed: the caller fails that request alone); without it, the error propagates."""
    # A finished grammar (its request stops at this step's token) has no next token: its row, computed by a step
    # planned ahead and dropped, stays all-allowed. So does a grammar still waiting for its start marker.
    grammars = [(row, request.grammar) for row, request in enumerate(requests)
                if request.grammar is not None and request.grammar.constrains_next]
    if not grammars:
        return None
    num_constrained = len(grammars)
    size = next(size for size in constrained_row_buckets(num_rows_padded) if size >= num_constrained)
    bitmask = np.empty((size, bitmask_words(vocab_size)), np.int32)
    bitmask[num_constrained:] = -1  # padding: never applied, but defined
    rows = np.full(size, num_rows_padded, np.int32)
    rows[:num_constrained] = [row for row, _ in grammars]
    try:
        fill_bitmasks([(grammar, index) for index, (_, grammar) in enumerate(grammars)], bitmask)
    except Exception:
        if row_errors is None:
            raise
        _fill_one_by_one(grammars, bitmask, row_errors)
    return bitmask, rows


def _fill_one_by_one(grammars: Sequence[tuple[int, RequestGrammar]], bitmask: np.ndarray,
                     row_errors: dict[int, Exception]) -> None:
    """The slow path, once filling every mask at once raised: each grammar alone, a failing one recorded by its
    request's row and its mask left all-allowed."""
    for index, (row, grammar) in enumerate(grammars):
        try:
            grammar.fill_bitmask(bitmask, index)
        except Exception as error:
            row_errors[row] = error
            bitmask[index] = -1
