"""jaxpaged's own checkpoint format: config.json + tokenizer files + params saved with orbax-checkpoint.

`jaxpaged convert` writes it, and the GGUF loader caches its dequantized weights in it, so a second start skips
the conversion.
"""

import json
import pathlib
from typing import Any, Optional

import numpy as np

from jaxpaged.weights.generation_config import GENERATION_CONFIG_FILE

MARKER_FILE = "jaxpaged.json"
FORMAT_VERSION = 1


def _checkpointer() -> Any:
    """orbax's StandardCheckpointer, imported on first use: orbax's import is ~0.4 s of CPU that every process start
    paid (`jaxpaged serve`, each test subprocess), and only a converted or GGUF-cached checkpoint needs it."""
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointer()


def is_converted_checkpoint(path: pathlib.Path) -> bool:
    """A directory written by save_converted."""
    return path.is_dir() and (path / MARKER_FILE).is_file()


def save_converted(path: pathlib.Path, hf_config: dict, params: dict[str, np.ndarray], tokenizer,
                   model_name: str, generation_config: Optional[dict[str, Any]] = None,
                   quantization: Optional[str] = None) -> None:
    """Write config, tokenizer and params under path (created; must not hold a checkpoint already), and the
    source's generation_config.json when it has one (its EOS ids and sampling defaults load from there).
    `quantization`: the scheme params' projections are in already ("int8": a GGUF's Q8_0 kept quantized)."""
    path = path.absolute()
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config, indent=1))
    if generation_config:
        (path / GENERATION_CONFIG_FILE).write_text(json.dumps(generation_config, indent=1))
    tokenizer.save_pretrained(str(path))
    checkpointer = _checkpointer()
    checkpointer.save(path / "params", {k: np.asarray(v) for k, v in params.items()}, force=True)
    checkpointer.wait_until_finished()
    # The marker goes last: a half-written directory is never mistaken for a checkpoint.
    (path / MARKER_FILE).write_text(json.dumps({"format": FORMAT_VERSION, "model_name": model_name,
                                                "quantization": quantization}))


def converted_quantization(path: pathlib.Path) -> Optional[str]:
    """The scheme a converted checkpoint's projections are stored in (None: float), read without its weights."""
    return json.loads((path / MARKER_FILE).read_text()).get("quantization")


def load_converted(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray], str]:
    """Return (HF config dict, params, model name)."""
    path = path.absolute()
    marker = json.loads((path / MARKER_FILE).read_text())
    if marker.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {marker.get('format')} is not {FORMAT_VERSION}; convert again")
    hf_config = json.loads((path / "config.json").read_text())
    restored = _checkpointer().restore(path / "params")
    return hf_config, {k: np.asarray(v) for k, v in restored.items()}, marker["model_name"]
