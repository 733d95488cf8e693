"""N-gram (prompt lookup) proposals: the tokens that followed the latest earlier occurrence of the request's newest
n tokens, in its prompt or output. Free to compute, and right whenever the output copies its context (quoting,
editing, extraction, a model repeating itself)."""

from collections.abc import Sequence
from typing import Any

from jaxpaged.core.request import Request
from jaxpaged.speculative.proposal import ProposalBatch


class NgramIndex:
    """Where each n-gram of one request's tokens last started (n from n_min to n_max), grown as tokens arrive, so a
    lookup costs one dict probe per n instead of a scan of the whole context."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.sizes = range(n_max, n_min - 1, -1)
        """Tried longest first: a longer match predicts better."""
        self._last_start: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._num_indexed: dict[int, int] = dict.fromkeys(self.sizes, 0)
        """Per n: start positions indexed so far (every one before the newest n-gram's)."""

    def continuation(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        """Up to max_tokens tokens that followed the latest earlier occurrence of tokens' last n tokens, for the
        longest n that occurred before; [] if none did."""
        length = len(tokens)
        for n in self.sizes:
            if length <= n:
                continue
            last_start = self._last_start[n]
            # Index every n-gram that starts before the newest one (which must not match itself).
            for start in range(self._num_indexed[n], length - n):
                last_start[tuple(tokens[start:start + n])] = start
            self._num_indexed[n] = max(self._num_indexed[n], length - n)
            match = last_start.get(tuple(tokens[length - n:]))
            if match is not None:
                return _copy_forward(tokens, match + n, max_tokens)
        return []


def _copy_forward(tokens: Sequence[int], start: int, count: int) -> list[int]:
    """count tokens copied from tokens[start:], reading on into the copy itself where tokens end (as an LZ77 match
    does): a latest occurrence p tokens back is a repeat of period p, which goes on the same way."""
    proposals = list(tokens[start:start + count])
    length = len(tokens)
    while len(proposals) < count:
        proposals.append(proposals[start + len(proposals) - length])
    return proposals


class NgramProposer:
    """Proposes by prompt lookup (vLLM's "ngram" method: prompt_lookup_min / prompt_lookup_max)."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, batch: ProposalBatch) -> list[tuple[list[int], Any]]:
        """Per request: up to its max_tokens tokens to follow its tokens, and its index (the state: the one returned
        last time for this request, or None). Host-only, one request at a time."""
        results = []
        for request, max_tokens, state in zip(batch.requests, batch.max_tokens, batch.states):
            index = state if isinstance(state, NgramIndex) else NgramIndex(self.prompt_lookup_min,
                                                                           self.prompt_lookup_max)
            results.append((index.continuation(request.all_token_ids, max_tokens), index))
        return results

    def warmup(self) -> float:
        """Nothing to compile."""
        return 0.0

    def retain(self, running: Sequence[Request]) -> None:
        """Nothing to forget: each request's index lives on the request (its speculation state)."""
