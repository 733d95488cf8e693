"""Fixtures shared by the API tests."""

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_tokenizer_dir):
    """The embedded model's real tokenizer (byte-level BPE), as the engine loads it: the tokenizer files converted
    from its GGUF once and cached (tests/weights/test_gguf_tokenizer.py holds them equal to transformers' own GGUF
    conversion, which took 3.5 s of CPU per xdist worker here against 1.1 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
