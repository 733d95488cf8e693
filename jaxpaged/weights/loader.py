"""One entry point for every model source: the embedded default, a GGUF file, an HF directory, a converted
checkpoint, a Hugging Face Hub repo id."""

import dataclasses
import hashlib
import os
import pathlib
import shutil
import tempfile
from typing import Optional

import numpy as np

from jaxpaged.models.int8_weights import WEIGHT_SCHEMES, quantize_params
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.registry import read_model_config
from jaxpaged.weights.compressed_tensors import QUANT_METHOD
from jaxpaged.weights.converted_store import (
    converted_quantization,
    is_converted_checkpoint,
    load_converted,
    save_converted,
)
from jaxpaged.weights.default_model import DEFAULT_MODEL_NAME, default_model_path
from jaxpaged.weights.generation_config import read_generation_config, sampling_defaults, with_generation_eos
from jaxpaged.weights.gguf_checkpoint import convert_gguf_tokenizer, load_gguf_checkpoint
from jaxpaged.weights.hf_checkpoint import is_hf_checkpoint, load_hf_checkpoint
from jaxpaged.weights.hub import download_snapshot, looks_like_repo_id


@dataclasses.dataclass
class LoadedModel:
    """Everything read from a model source, before it goes to the device."""

    name: str
    """The id the server reports (a Hub model's repo id)."""
    hf_config: dict
    """config.json, with eos_token_id taken from generation_config.json when that file sets one."""
    config: ModelConfig
    params: dict[str, np.ndarray]
    """Host arrays under jaxpaged's parameter names, in the checkpoint's own dtype (bfloat16 as ml_dtypes.bfloat16;
    a GGUF is dequantized to float32), or with the projections int8 plus their scales when loaded with a
    quantization (models/int8_weights.py). Some may be read-only views of memory-mapped files: the runner converts
    each shard to the engine dtype as it places it, so the host never holds a converted copy of the model."""
    tokenizer_dir: pathlib.Path
    """Where HF tokenizer files for this model live."""
    generation_defaults: dict = dataclasses.field(default_factory=dict)
    """Sampling settings from generation_config.json (temperature, top_p, top_k, repetition_penalty, do_sample ...:
    only the keys the file sets); not applied by the loader."""
    quantization: Optional[str] = None
    """The scheme the projections run in ("int8", "w8a8"), whether asked for or the checkpoint's own (a
    compressed-tensors checkpoint, a GGUF of Q8_0 projections); None: float."""


def cache_root() -> pathlib.Path:
    """~/.cache/jaxpaged (or $XDG_CACHE_HOME/jaxpaged)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jaxpaged"


def locate_model(model: Optional[str] = None, *, revision: Optional[str] = None,
                 cache_dir: Optional[pathlib.Path] = None) -> tuple[pathlib.Path, str]:
    """(the directory holding `model`'s config, weights and tokenizer files, the name it is served as), reading no
    weights: None is the embedded SmolLM2-135M-Instruct, else a local path or a Hugging Face Hub repo id
    ("org/name") fetched through the HF cache at `revision` (a branch, tag or commit; None: the default branch).
    A GGUF file is converted into a cached checkpoint once.

    An existing path wins over a repo id of the same spelling. Raises ValueError starting with "model: " when
    `model` is unusable.
    """
    path = default_model_path() if model is None else pathlib.Path(model).expanduser()
    if path.exists():
        if revision is not None:
            raise ValueError(f"model: a revision ({revision!r}) only applies to Hugging Face Hub ids, "
                             f"and {str(path)!r} is a local path")
        if is_converted_checkpoint(path) or is_hf_checkpoint(path):
            return path, path.name
        if path.is_file() and path.suffix == ".gguf":
            name = DEFAULT_MODEL_NAME if model is None else path.stem
            return _gguf_converted_dir(path, name, cache_dir or cache_root() / "converted"), name
        raise ValueError(f"model: {str(path)!r} is neither an HF checkpoint directory, a .gguf file "
                         "nor a jaxpaged checkpoint")
    if model is not None and looks_like_repo_id(model):
        return download_snapshot(model, revision), model
    raise ValueError(f"model: {model!r} does not exist "
                     "(give an HF directory, a .gguf file, a converted checkpoint or a Hugging Face repo id)")


def load_model(model: Optional[str] = None, *, revision: Optional[str] = None,
               cache_dir: Optional[pathlib.Path] = None, quantization: Optional[str] = None) -> LoadedModel:
    """Load `model` (see locate_model), with its generation_config.json's EOS ids and sampling defaults.

    `quantization` (EngineConfig.quantization): "int8" quantizes an HF checkpoint's projections layer by layer as
    they are read (peak host memory: the int8 model and one float layer); a converted checkpoint (a GGUF's cache
    included) is restored whole by orbax, then quantized tensor by tensor. A pre-quantized checkpoint (compressed-
    tensors; a GGUF of Q8_0 projections) loads in its own scheme, which `quantization` must agree with ("compressed-
    tensors" and None always do): ValueError naming `quantization` otherwise, before any weight is read."""
    directory, name = locate_model(model, revision=revision, cache_dir=cache_dir)
    if is_converted_checkpoint(directory):
        scheme = _converted_scheme(converted_quantization(directory), quantization)
        hf_config, params, name = load_converted(directory)
        params = quantize_params(params, scheme)
    else:
        hf_config, params, scheme = load_hf_checkpoint(directory, quantization)
    generation_config = read_generation_config(directory)
    hf_config = with_generation_eos(hf_config, generation_config)
    return LoadedModel(name, hf_config, read_model_config(hf_config), params, directory,
                       sampling_defaults(generation_config), scheme)


def _converted_scheme(stored: Optional[str], quantization: Optional[str]) -> Optional[str]:
    """The scheme a converted checkpoint runs in: `quantization`, or, when its projections are `stored` int8 (a
    GGUF's Q8_0 kept quantized), "int8" unless `quantization` is "w8a8" (the same weights, int8 activations too;
    llama.cpp multiplies Q8_0 weights with int8 activations as well). ValueError naming quantization otherwise."""
    if quantization == QUANT_METHOD:
        raise ValueError(f"quantization: {QUANT_METHOD!r} applies to compressed-tensors checkpoints (an HF "
                         "directory whose config.json has a quantization_config); this one is a converted checkpoint")
    if stored is not None and quantization not in (None, *WEIGHT_SCHEMES):
        raise ValueError(f"quantization: {quantization!r} disagrees with the checkpoint, whose projections are "
                         f"{stored} already (a GGUF's Q8_0 tensors, kept quantized); pass one of {WEIGHT_SCHEMES} "
                         "or nothing")
    return quantization or stored


_GGUF_CONVERSION = "q8_0-int8"
"""Part of a GGUF's cache key, so caches written before a change of what conversion makes (Q8_0 projections kept
int8 since this name) are not taken for current ones."""


def _gguf_converted_dir(path: pathlib.Path, name: str, cache_dir: pathlib.Path) -> pathlib.Path:
    """Convert once into a converted checkpoint keyed by the file's identity; its directory."""
    stat = path.stat()
    identity = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{_GGUF_CONVERSION}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    cached = cache_dir / f"{path.stem}-{key}"
    if not is_converted_checkpoint(cached):
        _convert_gguf_into(path, name, cached)
    return cached


def _convert_gguf_into(path: pathlib.Path, name: str, cached: pathlib.Path) -> None:
    """Convert into a private directory, then rename it into place.

    NOTE: several processes may start cold at once (test workers, a server beside a bench); each converts
    on its own and the first rename wins, so nobody ever reads a half-written checkpoint.
    """
    cached.parent.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f".{cached.name}-", dir=cached.parent))
    try:
        hf_config, params, quantization = load_gguf_checkpoint(path)
        convert_gguf_tokenizer(path, scratch)
        from transformers import PreTrainedTokenizerFast  # no torch: loads the files just written

        save_converted(scratch, hf_config, params, PreTrainedTokenizerFast.from_pretrained(str(scratch)), name,
                       quantization=quantization)
        if cached.exists() and not is_converted_checkpoint(cached):
            shutil.rmtree(cached, ignore_errors=True)  # left over from an interrupted conversion
        try:
            os.rename(scratch, cached)
        except OSError:
            if not is_converted_checkpoint(cached):  # lost the race to a complete checkpoint: fine
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
