"""Test engines that compile each program when a step first needs it, instead of warming up at start-up.

A serving warm-up compiles every bucket's step and every sampler variant (19 programs for TINY_ENGINE_OPTIONS);
most tests run a few of them (tests/engine/test_kv_cache_dtype.py compiled 45 programs with warm-ups, 26 without).
The programs, and so the tokens, are the same either way: only when they compile changes. tests/conftest.py turns
this on for the test process, and worker modules that start engines in a subprocess call it themselves. A test
that asserts that serving compiles nothing builds its engine inside `warmed_up_as_served()`.
"""

import contextlib
import os
from collections.abc import Iterator

FULL_WARMUP_ENV = "JAXPAGED_TESTS_FULL_WARMUP"
"""Set to 1 to run the suite with every engine warmed up at start-up, as `jaxpaged serve` does."""


def _set_warmup_default(warmup: bool) -> bool:
    """Sets LLMEngine's `warmup` default (what LLM and LLMEngine.from_options build with); returns the old one."""
    # Imported here, not at the top: tests/conftest.py imports this module before it installs the jaxtyping hook,
    # which must see the engine's modules imported after it.
    from jaxpaged.engine.llm_engine import LLMEngine

    defaults = LLMEngine.__init__.__kwdefaults__
    if defaults is None or "warmup" not in defaults:  # the switch would silently do nothing
        raise RuntimeError("LLMEngine.__init__ no longer takes a keyword-only `warmup`: update tests/lazy_compile.py")
    previous = defaults["warmup"]
    defaults["warmup"] = warmup
    return previous


def engines_compile_on_first_use() -> None:
    """From now on engines built in this process skip the start-up warm-up (unless FULL_WARMUP_ENV=1)."""
    if os.environ.get(FULL_WARMUP_ENV) != "1":
        _set_warmup_default(False)


@contextlib.contextmanager
def warmed_up_as_served() -> Iterator[None]:
    """Engines built inside warm up at start-up as in serving (every bucket's step and sampler variant compiled):
    for tests that assert that serving compiles nothing."""
    previous = _set_warmup_default(True)
    try:
        yield
    finally:
        _set_warmup_default(previous)
