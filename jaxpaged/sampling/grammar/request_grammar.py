"""RequestGrammar: one sample's position in its grammar; fills its row of the step's token bitmask and consumes
the sampled token. Its next mask can be computed ahead, off the interpreter's lock, while the host does the rest
of the step (prefetch_bitmasks).

Bitmask layout (llguidance's): row r, token t is allowed when bit t % 32 of int32 word t // 32 is set.
"""

import concurrent.futures
import functools
import os
from collections.abc import Sequence
from typing import Any, Optional, Union

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par


class RequestGrammar:
    """Wraps an llguidance matcher that has consumed the sample's output so far.

    NOTE: while a prefetched mask is being computed, the background job holds the matcher: every method that
    touches it waits for that job first (_settle), and is_finished reads a flag kept at accept()."""

    __slots__ = ("_matcher", "_finished", "_next_mask", "bitmask_words", "_starts_after", "_recent")

    def __init__(self, matcher: Any, bitmask_words: int, first_mask: Optional[np.ndarray] = None,
                 starts_after: Sequence[int] = ()) -> None:
        """first_mask: the tokens allowed at the start, when already known ([1, bitmask_words] int32 words).
        starts_after: the grammar waits until the output's tokens end with these (a reasoning end marker's ids);
        until then every token is allowed and none reaches the matcher."""
        if matcher.is_error():
            raise ValueError(f"structured_outputs: {matcher.get_error()}")
        self._matcher = matcher
        self._finished = matcher.is_stopped()
        self._starts_after = tuple(starts_after)
        """The marker still awaited (empty once written, or when there is none)."""
        self._recent: list[int] = []
        """The output's last tokens while the marker is awaited (at most its length)."""
        self._next_mask: Optional[tuple[Union[_MaskJob, _KnownMask], int]] = None
        """The tokens allowed next, computed ahead: (the job, its row there); None until prefetched."""
        if first_mask is not None:
            self._next_mask = (_KnownMask(first_mask), 0)
        self.bitmask_words = bitmask_words
        """int32 words per bitmask row (the logits' vocabulary / 32, rounded up)."""

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Writes the tokens allowed next into bitmask[row] (int32 words)."""
        if self._next_mask is not None:
            job, job_row = self._next_mask
            job.wait()
            bitmask[row] = job.words[job_row]
            return
        fill_next_token_bitmask(self._matcher, bitmask, row)

    @property
    def is_waiting(self) -> bool:
        """The grammar has not started: the output has not yet written the marker it starts after."""
        return bool(self._starts_after)

    @property
    def constrains_next(self) -> bool:
        """The next token is masked by this grammar (it has started and is not finished)."""
        return not self._finished and not self._starts_after

    def accept(self, token_id: int) -> None:
        """Advances past the sampled token. A token the mask allowed is always accepted; one it could not have
        allowed (an EOS after the grammar already stopped) changes nothing. While the grammar waits for its marker,
        the token only moves the marker search (the marker itself is not part of the constrained text)."""
        if self._starts_after:
            self._recent = (self._recent + [token_id])[-len(self._starts_after):]
            if tuple(self._recent) == self._starts_after:
                self._starts_after, self._recent = (), []
            return
        self._settle()
        self._next_mask = None  # computed for the position before this token
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token_id)
        self._finished = self._matcher.is_stopped() or self._matcher.is_error()

    @property
    def is_finished(self) -> bool:
        """The output is complete and nothing may follow it (a closed JSON value, a whole choice): stop here."""
        return self._finished

    def _settle(self) -> None:
        if self._next_mask is not None:
            self._next_mask[0].wait()


@functools.cache
def _executor() -> llguidance.LLExecutor:
    """llguidance's thread pool for computing many rows' masks at once (made on first use, one per process)."""
    return llguidance.LLExecutor()


@functools.cache
def _prefetch_thread() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that hands prefetch jobs to llguidance and waits there, without the interpreter's lock."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")


# A forked child has neither the pool's threads nor the prefetch thread (a job handed to them would never run).
os.register_at_fork(after_in_child=lambda: (_executor.cache_clear(), _prefetch_thread.cache_clear()))


class _MaskJob:
    """Several grammars' next masks being computed in the background: row i of `words` for the i-th matcher."""

    __slots__ = ("words", "_future")

    def __init__(self, matchers: Sequence[Any], bitmask_words: int) -> None:
        self.words = np.empty((len(matchers), bitmask_words), np.int32)
        rows = [(matcher, row) for row, matcher in enumerate(matchers)]
        self._future = _prefetch_thread().submit(fill_next_token_bitmask_par, _executor(), rows, self.words)

    def wait(self) -> None:
        """Returns once the masks are written (re-raises what llguidance raised)."""
        self._future.result()


class _KnownMask:
    """A mask computed before the sample started (GrammarCompiler's first mask, shared by every sample)."""

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray) -> None:
        self.words = words

    def wait(self) -> None:
        """Already there."""


def prefetch_bitmasks(grammars: Sequence[RequestGrammar]) -> None:
    """Starts computing the next mask of each unfinished grammar in the background and returns at once.

    Called once the step's tokens are accepted: the masks of the next step then take shape on another core
    while this thread detokenizes, makes outputs and plans the next step, instead of after all that (a JSON
    schema's mask costs ~25-50 us a row, docs/performance.md). A grammar that accepts another token first
    drops its prefetched mask."""
    unfinished = [grammar for grammar in grammars if grammar.constrains_next]
    if not unfinished:
        return
    job = _MaskJob([grammar._matcher for grammar in unfinished], unfinished[0].bitmask_words)
    for row, grammar in enumerate(unfinished):
        grammar._next_mask = (job, row)


def fill_bitmasks(rows: Sequence[tuple[RequestGrammar, int]], bitmask: np.ndarray) -> None:
    """Writes each (grammar, row)'s allowed tokens into bitmask[row]: prefetched masks are copied, the others go
    to llguidance's thread pool in one call, off Python's lock."""
    not_prefetched = []
    for grammar, row in rows:
        if grammar._next_mask is None:
            not_prefetched.append((grammar._matcher, row))
        else:
            grammar.fill_bitmask(bitmask, row)
    if len(not_prefetched) == 1:
        fill_next_token_bitmask(not_prefetched[0][0], bitmask, not_prefetched[0][1])
    elif not_prefetched:
        fill_next_token_bitmask_par(_executor(), not_prefetched, bitmask)
