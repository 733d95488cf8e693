"""PrefixAdvisor: how many prompt tokens the prefix cache missed only because the prompt diverged too early.

The prefix cache reuses a block only when every token before it matches (chain hashes). A prompt that starts with
something varying (a timestamp, a user id, reordered few-shot examples) therefore misses all its shared content.
This index remembers that content position-independently, so an admitted request can be told "N of your tokens were
seen before, but after the point where you diverged".

Why content-defined chunks rather than fixed 16-token shingles: aligned shingles only match content that sits at
the same offset modulo 16 (a timestamp one token longer hides the whole body), and rolling shingles need a hash
per token, which pure Python cannot do in the 0.2 ms budget for a 2k-token prompt. Instead a token whose id is a
multiple of ANCHOR_MODULUS starts a chunk (the first one wherever it is, later ones at least MIN_CHUNK tokens after
the previous start; a chunk is cut after MAX_CHUNK tokens without an anchor). Anchors depend only on the tokens,
so the same content yields the same chunks at any offset, and anchors are found with C-speed bytes operations:
Python work is per chunk, not per token.

Two kinds of entries share one LRU (bounded by `max_entries`), and both are keyed through the cache salt, so content
seen under one salt is never reported to a request with another (salts isolate tenants):
- content entries: the hash of each anchor-started chunk ("this content was seen somewhere");
- chain entries: the hash of each prompt prefix that ends at a chunk boundary, valued with the tokens of the chunk
  that followed it last time, which locates the token where a prompt diverged from the prompts seen before.

Host-only and dependency-free like the rest of jaxpaged.core.
"""

import array
import dataclasses
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple, Optional

logger = logging.getLogger(__name__)

ANCHOR_MODULUS = 16
"""A token whose id is a multiple of this starts a chunk: on average one chunk boundary per 16 tokens."""
MIN_CHUNK = 8
"""Anchors closer than this to the previous chunk start are ignored (tiny chunks would match by chance)."""
MAX_CHUNK = 64
"""A chunk is cut after this many tokens without an anchor, so one entry never covers a huge span."""
DEFAULT_MAX_ENTRIES = 1 << 16
"""About 10-20 MB of entries: some 500k tokens of distinct content."""

_CONTENT_TAG = 1 << 64  # content keys and chain keys live in disjoint int ranges of the one dict
_CHAIN_TAG = 2 << 64
_MASK = (1 << 64) - 1
_ANCHOR_TABLE = bytes(1 if value % ANCHOR_MODULUS == 0 else 0 for value in range(256))
_ITEM = array.array("I").itemsize
_LOW_BYTE = 0 if sys.byteorder == "little" else _ITEM - 1


@dataclasses.dataclass(frozen=True)
class Assessment:
    """What one prompt could have reused from content seen before."""

    num_tokens: int
    num_cached_tokens: int
    """Prefix-cache hit tokens the engine found for it."""
    divergence: int
    """First token where it differs from the longest-matching prompt seen before (num_tokens: no divergence)."""
    missed_reusable_tokens: int
    """Tokens at or after max(cached prefix, divergence) whose content was seen before under the same salt."""
    shared_run_start: int
    """Start of the first run of seen content after the divergence (num_tokens if none)."""
    shared_run_len: int
    """Its length in tokens."""


class _Split(NamedTuple):
    tokens: tuple[int, ...]
    bounds: list[int]
    """Chunk starts, then the prompt length."""
    chunks: list[tuple[int, ...]]
    hashes: list[int]
    keys: list[Optional[int]]
    """Content keys; None for chunks that are not anchored at both ends."""
    root: int
    """The salt's chain root: every key derives from it."""


def chunk_starts(token_ids: Sequence[int]) -> list[int]:
    """Chunk start positions: 0, the first anchor, then each anchor >= MIN_CHUNK after the previous start (or a
    forced cut MAX_CHUNK after it)."""
    low = array.array("I", token_ids).tobytes()[_LOW_BYTE::_ITEM] if _ITEM > 1 else bytes(token_ids)
    flags = low.translate(_ANCHOR_TABLE)
    starts = [0]
    find = flags.find
    n = len(flags)
    while True:
        last = starts[-1]
        # Chunk 0 ends at the first anchor whatever its length, so content right after a short varying head
        # (a timestamp) is chunked the same as anywhere else.
        anchor = find(1, last + MIN_CHUNK if last else 1)
        cut = last + MAX_CHUNK
        nxt = anchor if 0 <= anchor < cut else cut
        if nxt >= n:
            return starts
        starts.append(nxt)


class PrefixAdvisor:
    """Memory-bounded index of seen prompt content; `admit` assesses a prompt and then remembers it."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, log_threshold: int = 64,
                 log_interval_s: float = 10.0) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self.log_threshold = log_threshold
        """A request missing at least this many reusable tokens is logged (at most once per log_interval_s)."""
        self.log_interval_s = log_interval_s
        self.missed_reusable_tokens = 0
        """Cumulative over admitted requests."""
        self._entries: OrderedDict[int, Optional[tuple[int, ...]]] = OrderedDict()
        self._last_log = float("-inf")

    def __len__(self) -> int:
        return len(self._entries)

    def forget(self) -> None:
        """Drop the remembered content (the prefix cache was reset: nothing seen is reusable any more); the
        cumulative counter stays."""
        self._entries.clear()

    def _split(self, token_ids: Sequence[int], cache_salt: Optional[str]) -> _Split:
        """Chunk a prompt and hash each chunk once (tuples do not cache their hash)."""
        tokens = tuple(token_ids)
        bounds = chunk_starts(tokens)
        bounds.append(len(tokens))
        chunks = [tokens[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]
        hashes = [hash(chunk) for chunk in chunks]
        root = hash(("jaxpaged-advisor", cache_salt))
        # Chunk 0 does not start at an anchor and the last one is not closed by a boundary: no content key.
        keys = [None] + [(hash((root, h)) & _MASK) | _CONTENT_TAG for h in hashes[1:-1]] + [None]
        return _Split(tokens, bounds, chunks, hashes, keys[:len(chunks)], root)

    def observe(self, token_ids: Sequence[int], cache_salt: Optional[str] = None) -> None:
        """Remember a prompt's content and prefix chain (refreshing entries already there)."""
        self._observe(self._split(token_ids, cache_salt))

    def _observe(self, split: _Split) -> None:
        entries = self._entries
        move = entries.move_to_end
        node = split.root
        for chunk, chunk_hash, key in zip(split.chunks, split.hashes, split.keys):
            chain_key = (node & _MASK) | _CHAIN_TAG
            entries[chain_key] = chunk  # the chunk that followed this prefix, most recently
            move(chain_key)
            if key is not None:
                entries[key] = None
                move(key)
            node = hash((node, chunk_hash))
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def assess(self, token_ids: Sequence[int], cache_salt: Optional[str] = None,
               num_cached_tokens: int = 0) -> Assessment:
        """How much of the prompt past its cached prefix and its divergence point was seen before (read-only)."""
        return self._assess(self._split(token_ids, cache_salt), num_cached_tokens)

    def _assess(self, split: _Split, num_cached_tokens: int) -> Assessment:
        entries, bounds, root = self._entries, split.bounds, split.root
        n = len(split.tokens)
        divergence, node = n, root
        for i, (chunk, chunk_hash) in enumerate(zip(split.chunks, split.hashes)):
            seen = entries.get((node & _MASK) | _CHAIN_TAG)
            if seen != chunk:
                common = 0
                for a, b in zip(seen or (), chunk):
                    if a != b:
                        break
                    common += 1
                divergence = bounds[i] + common
                break
            node = hash((node, chunk_hash))
        begin = max(num_cached_tokens, divergence)
        missed, run_start, run_len, in_run = 0, n, 0, True
        for i, key in enumerate(split.keys):
            lo, hi = max(bounds[i], begin), bounds[i + 1]
            if hi <= lo:
                continue
            if key is not None and key in entries:
                missed += hi - lo
                if run_start == n:
                    run_start = lo
                if in_run:
                    run_len += hi - lo
            elif run_start != n:
                in_run = False
        return Assessment(n, num_cached_tokens, divergence, missed, run_start, run_len)

    def admit(self, token_ids: Sequence[int], cache_salt: Optional[str], num_cached_tokens: int,
              decode: Optional[Callable[[Sequence[int]], str]] = None) -> Assessment:
        """Assess an admitted request, count its missed tokens, maybe log, then remember it.

        `decode` (only when the operator opted in: prompts can be private) adds a short text snippet at the
        divergence to the log line.
        """
        split = self._split(token_ids, cache_salt)
        result = self._assess(split, num_cached_tokens)
        self._observe(split)
        self.missed_reusable_tokens += result.missed_reusable_tokens
        if result.missed_reusable_tokens >= self.log_threshold:
            self._maybe_log(result, split.tokens, decode)
        return result

    def _maybe_log(self, result: Assessment, tokens: tuple[int, ...],
                   decode: Optional[Callable[[Sequence[int]], str]]) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_interval_s:
            return
        self._last_log = now
        snippet = ""
        if decode is not None:
            snippet = f" (text there: {decode(tokens[result.divergence:result.divergence + 12])!r})"
        logger.info(
            "prefix cache: a prompt of %d tokens diverged from earlier prompts at token %d%s and then shared %d "
            "tokens at %d; %d seen tokens were recomputed (move the varying part after the shared part to reuse "
            "them)", result.num_tokens, result.divergence, snippet, result.shared_run_len, result.shared_run_start,
            result.missed_reusable_tokens)
