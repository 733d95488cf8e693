"""One entry point for every model source: the embedded default, a GGUF file, an HF directory, a converted
checkpoint."""

import dataclasses
import hashlib
import os
import pathlib
import shutil
import tempfile
from typing import Optional

import numpy as np

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.weights.converted_store import is_converted_checkpoint, load_converted, save_converted
from jaxpaged.weights.default_model import DEFAULT_MODEL_NAME, default_model_path
from jaxpaged.weights.gguf_checkpoint import convert_gguf_tokenizer, load_gguf_checkpoint
from jaxpaged.weights.hf_checkpoint import is_hf_checkpoint, load_hf_checkpoint


@dataclasses.dataclass
class LoadedModel:
    """Everything read from a model source, before it goes to the device."""

    name: str
    """The id the server reports."""
    hf_config: dict
    config: ModelConfig
    params: dict[str, np.ndarray]
    """float32 host arrays under jaxpaged's parameter names."""
    tokenizer_dir: pathlib.Path
    """Where HF tokenizer files for this model live."""


def cache_root() -> pathlib.Path:
    """~/.cache/jaxpaged (or $XDG_CACHE_HOME/jaxpaged)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jaxpaged"


def load_model(model: Optional[str] = None, *, cache_dir: Optional[pathlib.Path] = None) -> LoadedModel:
    """Load `model` (None: the embedded SmolLM2-135M-Instruct); ValueError naming `model` when it is unusable."""
    path = default_model_path() if model is None else pathlib.Path(model).expanduser()
    if not path.exists():
        raise ValueError(f"model: {model!r} does not exist "
                         "(give an HF directory, a .gguf file or a converted checkpoint)")
    if is_converted_checkpoint(path):
        hf_config, params, name = load_converted(path)
        return LoadedModel(name, hf_config, ModelConfig.from_hf(hf_config), params, path)
    if is_hf_checkpoint(path):
        hf_config, params = load_hf_checkpoint(path)
        return LoadedModel(path.name, hf_config, ModelConfig.from_hf(hf_config), params, path)
    if path.is_file() and path.suffix == ".gguf":
        name = DEFAULT_MODEL_NAME if model is None else path.stem
        return _load_gguf_cached(path, name, cache_dir or cache_root() / "converted")
    raise ValueError(f"model: {str(path)!r} is neither an HF checkpoint directory, a .gguf file "
                     "nor a jaxpaged checkpoint")


def _load_gguf_cached(path: pathlib.Path, name: str, cache_dir: pathlib.Path) -> LoadedModel:
    """Dequantize once, then keep the result as a converted checkpoint keyed by the file's identity."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir / f"{path.stem}-{key}"
    if not is_converted_checkpoint(cached):
        _convert_gguf_into(path, name, cached)
    hf_config, params, name = load_converted(cached)
    return LoadedModel(name, hf_config, ModelConfig.from_hf(hf_config), params, cached)


def _convert_gguf_into(path: pathlib.Path, name: str, cached: pathlib.Path) -> None:
    """Convert into a private directory, then rename it into place.

    NOTE: several processes may start cold at once (test workers, a server beside a bench); each converts
    on its own and the first rename wins, so nobody ever reads a half-written checkpoint.
    """
    cached.parent.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f".{cached.name}-", dir=cached.parent))
    try:
        hf_config, params = load_gguf_checkpoint(path)
        convert_gguf_tokenizer(path, scratch)
        from transformers import PreTrainedTokenizerFast  # no torch: loads the files just written

        save_converted(scratch, hf_config, params, PreTrainedTokenizerFast.from_pretrained(str(scratch)), name)
        if cached.exists() and not is_converted_checkpoint(cached):
            shutil.rmtree(cached, ignore_errors=True)  # left over from an interrupted conversion
        try:
            os.rename(scratch, cached)
        except OSError:
            if not is_converted_checkpoint(cached):  # lost the race to a complete checkpoint: fine
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
