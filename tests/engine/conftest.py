"""Engines over the tiny random model, shared per session (each one compiles)."""

import pytest

from tests.conftest import TINY_ENGINE_OPTIONS


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir):
    """jaxpaged.LLM on the tiny model, warmed up (every bucket and sampler variant compiled)."""
    from jaxpaged.llm import LLM

    return LLM(str(tiny_model_dir), **TINY_ENGINE_OPTIONS)
