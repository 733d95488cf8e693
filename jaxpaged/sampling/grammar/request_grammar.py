"""RequestGrammar: one sample's position in its grammar; fills its row of the step's token bitmask and consumes
the sampled token.

Bitmask layout (llguidance's): row r, token t is allowed when bit t % 32 of int32 word t // 32 is set.
"""

import functools
from collections.abc import Sequence
from typing import Any

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par


class RequestGrammar:
    """Wraps an llguidance matcher that has consumed the sample's output so far."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: Any) -> None:
        if matcher.is_error():
            raise ValueError(f"structured_outputs: {matcher.get_error()}")
        self._matcher = matcher

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Writes the tokens allowed next into bitmask[row] (int32 words)."""
        fill_next_token_bitmask(self._matcher, bitmask, row)

    def accept(self, token_id: int) -> None:
        """Advances past the sampled token. A token the mask allowed is always accepted; one it could not have
        allowed (an EOS after the grammar already stopped) changes nothing."""
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token_id)

    @property
    def is_finished(self) -> bool:
        """The output is complete and nothing may follow it (a closed JSON value, a whole choice): stop here."""
        return self._matcher.is_stopped() or self._matcher.is_error()


@functools.cache
def _executor() -> llguidance.LLExecutor:
    """llguidance's thread pool for computing many rows' masks at once (made on first use, one per process)."""
    return llguidance.LLExecutor()


def fill_bitmasks(rows: Sequence[tuple[RequestGrammar, int]], bitmask: np.ndarray) -> None:
    """Writes each (grammar, row)'s allowed tokens into bitmask[row]. Several rows go to llguidance's thread
    pool in one call, off Python's lock: a JSON schema's mask costs ~45-55 us a row (Zen 5 EPYC,
    docs/performance.md), so one at a time in Python was most of a step's host time at 10 % of 512 rows."""
    if len(rows) == 1:
        grammar, row = rows[0]
        grammar.fill_bitmask(bitmask, row)
        return
    fill_next_token_bitmask_par(_executor(), [(grammar._matcher, row) for grammar, row in rows], bitmask)
