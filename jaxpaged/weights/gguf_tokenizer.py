"""A GGUF's tokenizer as HF tokenizer files, without torch.

transformers converts a GGUF vocabulary into a `tokenizers` tokenizer with its own builders (byte-level BPE,
sentencepiece, ...), but `AutoTokenizer.from_pretrained(gguf_file=...)` reaches them through its GGUF reader, which
imports torch. A serving install has no torch, so the metadata is read here with the gguf package and handed to
transformers' builders directly; tests/weights/test_gguf_tokenizer.py checks the result against AutoTokenizer's.

Child-process entry point: `python -m jaxpaged.weights.gguf_tokenizer FILE.gguf OUT_DIR` saves the files
(gguf_checkpoint.convert_gguf_tokenizer runs it).
"""

import pathlib
import sys
from typing import Any

import gguf

# GGUF's special-token id keys under the tokenizer_config names HF saves the tokens' text as.
_SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                      "pad_token": "padding_token_id"}


def _value(field: gguf.ReaderField) -> Any:
    """A metadata field as Python: a str, a number, or a list of either."""
    value = field.contents()
    return value.item() if hasattr(value, "item") else value


def read_tokenizer_metadata(path: pathlib.Path) -> dict[str, Any]:
    """The file's `general.architecture` and `tokenizer.*` metadata, by key (no tensor is read)."""
    reader = gguf.GGUFReader(str(path))
    return {key: _value(field) for key, field in reader.fields.items()
            if key == "general.architecture" or key.startswith("tokenizer.")}


def tokenizer_inputs(metadata: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(architecture, the builders' tokenizer dict, tokenizer_config entries), named as transformers names them."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    groups = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                      if f"tokenizer.{key}" in metadata}
              for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, tokenizer_config = groups["tokenizer"], groups["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        # NOTE: llama.cpp adds BOS to a sentencepiece vocabulary whose file does not say otherwise (older files
        # carry no flag), and so does transformers' own GGUF path.
        tokenizer_config.setdefault("add_bos_token", True)
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return metadata["general.architecture"], tokenizer, tokenizer_config


def save_gguf_tokenizer(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Convert the GGUF's tokenizer with transformers' builders and save it as HF tokenizer files in out_dir."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, tokenizer_config = tokenizer_inputs(read_tokenizer_metadata(gguf_path))
    backend, extra_config = convert_gguf_tokenizer(architecture, tokenizer_dict)
    PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra_config).save_pretrained(
        str(out_dir))


if __name__ == "__main__":
    save_gguf_tokenizer(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
