"""The test session's engines skip the start-up warm-up, except inside warmed_up_as_served() (tests/lazy_compile.py)."""

import os

import pytest

from jaxpaged.engine.llm_engine import LLMEngine
from tests.lazy_compile import FULL_WARMUP_ENV, warmed_up_as_served


def _warmup_default() -> bool:
    defaults = LLMEngine.__init__.__kwdefaults__
    assert defaults is not None
    return defaults["warmup"]


@pytest.mark.skipif(os.environ.get(FULL_WARMUP_ENV) == "1", reason="the suite runs with every engine warmed up")
def test_engines_built_by_tests_compile_on_first_use():
    """conftest turned the warm-up off for engines built in the test process."""
    assert _warmup_default() is False


def test_warmed_up_as_served_turns_the_warm_up_on_and_restores_the_default():
    """Inside the context engines warm up as in serving; after it (an exception included) the default is back."""
    before = _warmup_default()
    with pytest.raises(RuntimeError, match="a test failed"), warmed_up_as_served():
        assert _warmup_default() is True
        raise RuntimeError("a test failed")
    assert _warmup_default() is before

