"""Engines over the tiny random model, shared per session (each one compiles)."""

import pytest

from tests.conftest import TINY_ENGINE_OPTIONS
from tests.lazy_compile import warmed_up_as_served


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir):
    """jaxpaged.LLM on the tiny model, warmed up (every bucket and sampler variant compiled)."""
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # test_no_recompile, test_prompt_logprobs and test_async_scheduling count compiles
        return LLM(str(tiny_model_dir), **TINY_ENGINE_OPTIONS)
