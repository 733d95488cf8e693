"""Structured outputs on the device: each constrained row's logits are masked by its grammar's token bitmask
before the sampler runs, so the sampler itself (and its compiled variants) never changes.

The bitmask is [rows, ceil(vocab / 32)] int32 (llguidance's layout: bit t % 32 of word t // 32 allows token t);
unconstrained rows are all ones. The masking function is compiled once per row bucket at warm-up and runs only
on steps where some row has a grammar: a step without one pays nothing.
"""

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxpaged.core.request import Request
from jaxpaged.sampling.grammar import fill_bitmasks


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return -(-vocab_size // 32)


@jax.jit
def apply_token_bitmask(logits: Float[Array, "num_rows vocab"],
                        bitmask: Int[Array, "num_rows words"]) -> Float[Array, "num_rows vocab"]:
    """-inf on every token the row's bitmask does not allow."""
    num_rows, vocab_size = logits.shape
    bits = (bitmask[:, :, None] >> jnp.arange(32, dtype=jnp.int32)) & 1
    allowed = bits.reshape(num_rows, -1)[:, :vocab_size].astype(bool)
    return jnp.where(allowed, logits, -jnp.inf)


def fill_step_bitmask(requests: Sequence[Request], num_rows_padded: int,
                      vocab_size: int) -> Optional[np.ndarray]:
    """The step's bitmask (row j for requests[j]), or None when no request has a grammar (nothing to mask)."""
    # A finished grammar (its request stops at this step's token) has no next token: its row, computed by a step
    # planned ahead and dropped, stays all-allowed.
    grammars = [(row, request.grammar) for row, request in enumerate(requests)
                if request.grammar is not None and not request.grammar.is_finished]
    if not grammars:
        return None
    bitmask = np.full((num_rows_padded, bitmask_words(vocab_size)), -1, np.int32)
    fill_bitmasks([(grammar, row) for row, grammar in grammars], bitmask)
    return bitmask
