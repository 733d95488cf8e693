"""The model registry: HF architecture names (config.json's architectures[0]) and GGUF ones (general.architecture)
-> the ModelEntry that reads the config, names the weights and builds the model.

Adding a family is a file in models/families/ (a config reader, its names, its ENTRIES) and one line below.
"""

from typing import Any

from jaxpaged.models.families import gemma, gpt_oss, llama, mixtral, qwen_moe, text_towers
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.model_entry import GgufFormat, ModelEntry

REGISTRY: dict[str, ModelEntry] = {entry.architecture: entry for entry in (
    *llama.ENTRIES,
    *gemma.ENTRIES,
    *text_towers.ENTRIES,
    *qwen_moe.ENTRIES,
    *mixtral.ENTRIES,
    *gpt_oss.ENTRIES,
)}
"""Every supported architecture by its HF name."""


def supported_architectures() -> list[str]:
    """The HF names of every registered architecture, sorted."""
    return sorted(REGISTRY)


def resolve(architecture: str) -> ModelEntry:
    """The entry of `architecture`; ValueError naming it and the supported ones when there is none."""
    entry = REGISTRY.get(architecture)
    if entry is None:
        raise ValueError(f"architecture: {architecture!r} is not supported; supported: {supported_architectures()}")
    return entry


def resolve_gguf(architecture: str) -> tuple[ModelEntry, GgufFormat]:
    """(the entry, its GGUF format) of files that say general.architecture = `architecture`; ValueError naming it
    and the supported ones when no entry reads such files."""
    by_gguf = {entry.gguf.architecture: (entry, entry.gguf) for entry in REGISTRY.values() if entry.gguf is not None}
    if architecture not in by_gguf:
        raise ValueError(f"GGUF architecture {architecture!r} is not supported; supported: {sorted(by_gguf)}")
    return by_gguf[architecture]


def architecture_of(raw: dict) -> str:
    """The architecture an HF config dict names: architectures[0], else the one registered for its model_type (a
    config without that list); an unknown model_type gives a name resolve() refuses."""
    architectures = raw.get("architectures")
    if architectures:
        return architectures[0]
    model_type = raw.get("model_type")
    by_type = {entry.model_type: name for name, entry in REGISTRY.items() if entry.model_type is not None}
    return by_type.get(model_type or "", f"<model_type {model_type!r}>")


def read_model_config(hf_config: Any) -> ModelConfig:
    """The ModelConfig of an HF config (a dict, or a transformers PretrainedConfig), read by its architecture's
    entry; ValueError naming the architecture when it is not supported."""
    raw = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    architecture = architecture_of(raw)
    return resolve(architecture).read_config(raw, architecture)
