"""GrammarCompiler: a request's StructuredOutputsParams -> a CompiledGrammar (checked, off the engine loop) -> one
matcher per sample, copied from the compiled one.

Everything is checked before the request reaches the scheduler (a bad schema, regex or grammar, or one over the
limits of limits.py, is a ValueError naming the field the user set, so the server answers 400 before anything runs); a
request never fails mid-stream because of its grammar. The work happens away from the engine loop: submit() runs it on
a few threads, which measure the constraint, have a worker process compile and check it (worker_pool.py: llguidance
crashing on it kills that worker, not the server), then build the engine's own matcher and its first mask (llguidance
drops the GIL for both). llguidance (Rust, no torch) is what vLLM uses; its tokenizer view is built once per engine.
"""

import collections
import concurrent.futures
import copy
import os
import threading
from collections.abc import Sequence
from typing import Any, Optional

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask

from jaxpaged.sampling.grammar.grammar_source import constraint_key, grammar_of_key, terse_limits
from jaxpaged.sampling.grammar.request_grammar import RequestGrammar
from jaxpaged.sampling.grammar.worker_pool import NUM_GRAMMAR_WORKERS, GrammarWorkerCrash, GrammarWorkerPool
from jaxpaged.sampling.grammar.worker_protocol import WORKER_NICENESS
from jaxpaged.sampling.params import StructuredOutputsParams

GRAMMAR_CACHE_SIZE = 64
"""Compiled grammars kept (least recently used dropped first): a client sending the same schema with every request
(tools, response_format) pays the compile once."""


class CompiledGrammar:
    """A constraint compiled for this engine: its matcher at the start of the output (copied for every sample, never
    advanced itself) and the tokens allowed first."""

    __slots__ = ("grammar", "matcher", "first_mask")

    def __init__(self, grammar: str, matcher: Any, first_mask: np.ndarray) -> None:
        self.grammar = grammar
        """llguidance's grammar text."""
        self.matcher = matcher
        """An llguidance LLMatcher that has consumed nothing."""
        self.first_mask = first_mask
        """int32 words [1, bitmask words]: the tokens allowed at the start (computed once, off the engine loop)."""


class GrammarCompiler:
    """Compiles and validates grammars against the model's tokenizer, off the caller's thread; makes the per-sample
    matchers. Thread-safe."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int], *,
                 num_workers: int = NUM_GRAMMAR_WORKERS, worker_env: Optional[dict[str, str]] = None) -> None:
        """`vocab_size`: the logits' width (a model may pad its vocabulary past the tokenizer's); `worker_env`:
        extra environment variables for the worker processes (tests)."""
        self.vocab_size = vocab_size
        self.bitmask_words = -(-vocab_size // 32)
        self._hf_tokenizer = hf_tokenizer
        self._eos_token_ids = list(eos_token_ids)
        self._num_workers = num_workers
        self._worker_env = worker_env
        self._lock = threading.Lock()
        self._tokenizer: Optional[llguidance.LLTokenizer] = None  # built on first use: most engines see no grammar
        self._pool: Optional[GrammarWorkerPool] = None
        self._threads: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._cache: collections.OrderedDict[tuple, CompiledGrammar] = collections.OrderedDict()
        """Compiled grammars by constraint_key, least recently used first."""

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer (~0.4 s to build, once)."""
        with self._lock:
            if self._tokenizer is None:
                tokenizer_json, vocab_size, eos = self._tokenizer_spec()
                self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos or None)
            return self._tokenizer

    @property
    def pool(self) -> GrammarWorkerPool:
        """The worker processes (started on first compile)."""
        with self._lock:
            if self._pool is None:
                self._pool = GrammarWorkerPool(self._tokenizer_spec(), self._num_workers, self._worker_env)
            return self._pool

    def submit(self, params: StructuredOutputsParams) -> "concurrent.futures.Future[CompiledGrammar]":
        """Starts compiling `params` off this thread; the future raises ValueError "<params.field>: <why>" for a
        constraint that is invalid, over a limit, or crashed the grammar engine."""
        with self._lock:
            if self._threads is None:  # two more threads than workers: cache hits go on while all workers compile
                self._threads = concurrent.futures.ThreadPoolExecutor(
                    self._num_workers + 2, thread_name_prefix="grammar-prepare", initializer=_lower_thread_priority)
            return self._threads.submit(self._prepare, params)

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """submit(params)'s result, waited for (the offline engine's path)."""
        return self.submit(params).result()

    def new_request_grammar(self, compiled: CompiledGrammar, starts_after: Sequence[int] = ()) -> RequestGrammar:
        """A fresh matcher at the start of the output for one sample: a copy of the compiled one (each sample consumes
        its own tokens), its first mask already known; `starts_after`: the token ids it waits for
        (RequestGrammar)."""
        return RequestGrammar(compiled.matcher.deep_copy(), self.bitmask_words, first_mask=compiled.first_mask,
                              starts_after=starts_after)

    def close(self) -> None:
        """Stops the worker processes and the threads (queued compiles are cancelled); a later submit() starts them
        again."""
        with self._lock:
            threads, self._threads = self._threads, None
            pool, self._pool = self._pool, None
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
        if pool is not None:
            pool.close()

    def _prepare(self, params: StructuredOutputsParams) -> CompiledGrammar:
        key = constraint_key(params)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                return compiled
        try:
            outcome, text = self.pool.compile(key) if _needs_worker(key) else ("ok", grammar_of_key(key))
        except GrammarWorkerCrash as crash:  # that worker is gone; the next compile starts a new one
            raise ValueError(f"{params.field}: {crash}") from None
        if outcome != "ok":
            raise ValueError(f"{params.field}: {text}")
        # The worker has built and used the same matcher, so this cannot crash; llguidance drops the GIL here.
        matcher = llguidance.LLMatcher(self.tokenizer, text, log_level=0, limits=terse_limits())
        first_mask = np.zeros((1, self.bitmask_words), np.int32)
        # On a copy, so the compiled matcher stays exactly as built (it is only ever copied); the lexer states this
        # builds are shared by every copy, so the samples' next masks start warm.
        probe = matcher.deep_copy()
        if not probe.is_error():
            fill_next_token_bitmask(probe, first_mask, 0)
        if matcher.is_error() or probe.is_error():
            raise ValueError(f"{params.field}: {matcher.get_error() or probe.get_error()}")
        compiled = CompiledGrammar(text, matcher, first_mask)
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > GRAMMAR_CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _tokenizer_spec(self) -> tuple[str, int, list[int]]:
        """(the tokenizer's JSON as llguidance reads it, the logits' vocabulary size, the EOS ids)."""
        backend = copy.copy(self._hf_tokenizer.backend_tokenizer)  # a fast tokenizer's Rust side
        backend.no_padding()
        backend.no_truncation()
        eos = self._eos_token_ids or ([self._hf_tokenizer.eos_token_id]
                                      if self._hf_tokenizer.eos_token_id is not None else [])
        return backend.to_str(), self.vocab_size, eos


def _needs_worker(key: tuple) -> bool:
    """Whether a constraint comes from the client (json_object's grammar is the engine's own: no worker needed)."""
    return key[0] != "json_object"


def _lower_thread_priority() -> None:
    """Runs the calling thread below the engine loop (Linux: a thread's nice value is its own), as the workers."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not allowed: run at the engine's priority
        pass
