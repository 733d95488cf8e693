"""The grammar worker: a child process that compiles and checks grammars, so llguidance crashing on one kills only it.

Run as `python -m jaxpaged.sampling.grammar.compile_worker` by worker_pool.GrammarWorker. It reads frames from stdin
and writes frames to stdout (worker_protocol.py). The first frame is the tokenizer
(its Hugging Face JSON, the logits' vocabulary size, the EOS ids); every later one is a constraint's cache key
(grammar_source.constraint_key), answered with ("ok", grammar) or ("error", why). The worker does everything the
engine will do with the grammar before a token is sampled (compile, validate, build a matcher, compute its first
mask), so a grammar that would crash llguidance crashes here. It exits when stdin closes (its engine is gone).
"""

import os
import sys

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask

from jaxpaged.sampling.grammar.grammar_source import grammar_of_key, terse_limits
from jaxpaged.sampling.grammar.worker_protocol import CRASH_ON_ENV, WORKER_NICENESS, read_frame, write_frame


def compile_checked(key: tuple, tokenizer: "llguidance.LLTokenizer", vocab_size: int) -> tuple[str, str]:
    """("ok", the grammar) if the constraint compiles and its first mask can be computed, else ("error", why)."""
    try:
        grammar = grammar_of_key(key)
    except (TypeError, ValueError) as error:
        return "error", str(error)
    problem = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if problem:
        return "error", problem
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=terse_limits())
    if not matcher.is_error():
        fill_next_token_bitmask(matcher, np.zeros((1, -(-vocab_size // 32)), np.int32), 0)
    if matcher.is_error():
        return "error", matcher.get_error()
    return "ok", grammar


def main() -> None:
    """Serves compile requests from stdin until it closes."""
    os.nice(WORKER_NICENESS)  # a compile takes the CPU the engine loop leaves, never the loop's own
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames may reach the pipe
    init = read_frame(requests)
    if init is None:
        return
    tokenizer_json, vocab_size, eos_token_ids = init
    tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_token_ids or None)
    crash_on = os.environ.get(CRASH_ON_ENV)
    write_frame(replies, ("ready", ""))
    while (key := read_frame(requests)) is not None:
        if crash_on is not None and key == ("regex", crash_on):
            os.abort()
        write_frame(replies, compile_checked(key, tokenizer, vocab_size))


if __name__ == "__main__":
    main()
