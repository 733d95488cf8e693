"""The model as an HF checkpoint directory, for peers that load only that format (vLLM): an HF directory as it is,
a GGUF file (the embedded default model) converted once and cached.

transformers reads a GGUF (dequantized to float32) but will not save a model it loaded from one, so the conversion
copies the state dict into a model built from the same config and saves that, beside the GGUF's tokenizer.
"""

import copy
import pathlib
import shutil
import tempfile
from typing import Optional

from jaxpaged.bench.peers.hf_model import hf_source


def _is_hf_directory(path: pathlib.Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def converted_directory(gguf: pathlib.Path, cache: pathlib.Path) -> pathlib.Path:
    """Where the conversion of `gguf` is cached (its name and size tell versions apart)."""
    return cache / "hf-from-gguf" / f"{gguf.stem}-{gguf.stat().st_size}"


def hf_directory(model: Optional[str], cache: Optional[pathlib.Path] = None) -> pathlib.Path:
    """An HF checkpoint directory holding `model` (None: the embedded GGUF); PeerUnavailable for other formats."""
    source = hf_source(model)
    if "gguf_file" not in source:
        return pathlib.Path(source["pretrained_model_name_or_path"])
    if cache is None:
        from jaxpaged.weights.loader import cache_root

        cache = cache_root()
    gguf = pathlib.Path(source["pretrained_model_name_or_path"]) / source["gguf_file"]
    target = converted_directory(gguf, cache)
    if not _is_hf_directory(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            _convert(source, staging)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)  # whole or absent: an interrupted conversion is never mistaken for one
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(source: dict, out: pathlib.Path) -> None:
    """Save the GGUF's weights (float32) and tokenizer as an HF directory under `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):  # the weights are dequantized now; a reader must not look for GGUF
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(**source).save_pretrained(out)
