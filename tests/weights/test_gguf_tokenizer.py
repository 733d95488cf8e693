"""The torch-free GGUF tokenizer conversion (what a serving install without torch runs) writes the same tokenizer
as transformers' AutoTokenizer(gguf_file=...), and never imports torch."""

import json
import pathlib
import subprocess
import sys

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from jaxpaged.weights.default_model import default_model_path
from jaxpaged.weights.gguf_tokenizer import read_tokenizer_metadata, save_gguf_tokenizer, tokenizer_inputs

TEXTS = ["Hello world", " leading  spaces\n\ttabs", "日本語 émoji 🤖", "<|im_start|>user\nHi<|im_end|>", ""]


@pytest.fixture(scope="module")
def gguf_path() -> pathlib.Path:
    try:
        return default_model_path()
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as error:
        pytest.skip(f"the embedded GGUF is not installed: {error}")


def test_matches_autotokenizers_conversion(gguf_path, tmp_path):
    save_gguf_tokenizer(gguf_path, tmp_path / "ours")
    AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).save_pretrained(
        str(tmp_path / "reference"))
    assert json.loads((tmp_path / "ours" / "tokenizer.json").read_text()) == \
        json.loads((tmp_path / "reference" / "tokenizer.json").read_text())
    ours, reference = (PreTrainedTokenizerFast.from_pretrained(str(tmp_path / name)) for name in ("ours", "reference"))
    for text in TEXTS:
        assert ours.encode(text) == reference.encode(text), text
    assert (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token) == \
        (reference.bos_token, reference.eos_token, reference.pad_token, reference.unk_token)
    messages = [{"role": "user", "content": "Say hello."}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_special_tokens_are_named_by_their_ids(gguf_path):
    metadata = read_tokenizer_metadata(gguf_path)
    architecture, tokenizer, config = tokenizer_inputs(metadata)
    assert architecture == "llama"
    assert config["eos_token"] == tokenizer["tokens"][metadata["tokenizer.ggml.eos_token_id"]]
    assert config["bos_token"] == tokenizer["tokens"][metadata["tokenizer.ggml.bos_token_id"]]


def test_conversion_process_never_imports_torch(gguf_path, tmp_path):
    """A serving install has no torch: the child process that converts must not need it."""
    code = ("import sys, pathlib; sys.modules['torch'] = None; "  # None: any `import torch` raises ImportError
            "from jaxpaged.weights.gguf_tokenizer import save_gguf_tokenizer; "
            f"save_gguf_tokenizer(pathlib.Path({str(gguf_path)!r}), pathlib.Path({str(tmp_path / 'out')!r}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "tokenizer.json").is_file()
