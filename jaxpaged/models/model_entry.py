"""ModelEntry: everything the engine needs to know about one architecture, as its family's file declares it."""

import dataclasses
from collections.abc import Callable
from typing import Optional

from flax import nnx

from jaxpaged.models.llama import LlamaForCausalLM
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.weight_names import WeightNames


@dataclasses.dataclass(frozen=True)
class GgufFormat:
    """How a GGUF file of this architecture is read."""

    architecture: str
    """The file's general.architecture ("llama", "qwen2")."""
    names: WeightNames
    """llama.cpp's tensor names of the parameters."""
    unpermutes_rope: bool = False
    """llama.cpp interleaves each head's rotary pairs in q/k rows (its Llama and Mistral converters): undo it."""


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One architecture: its config reader, its checkpoint names and the model class that runs it.

    A family that differs only in constants (Gemma's norms, caps and windows) points at the shared decoder and sets
    ModelConfig's variant fields in its reader; a family with fields or weights of its own returns a ModelConfig
    subclass (overriding layer_shapes for its weights), and one with its own blocks (a mixture-of-experts MLP)
    names a LlamaForCausalLM subclass overriding feed_forward as model_class.
    """

    architecture: str
    """HF's config.json architectures[0] ("LlamaForCausalLM")."""
    read_config: Callable[[dict, str], ModelConfig]
    """(config.json as a dict, the architecture) -> ModelConfig; ValueError naming a field it cannot take."""
    hf_names: WeightNames
    """Where an HF safetensors checkpoint keeps each parameter."""
    model_class: Callable[..., nnx.Module] = LlamaForCausalLM
    """Built as model_class(cfg, params, packed=..., int8_matmul=...); LlamaForCausalLM's __call__, hidden_states and
    logits are what the runner calls."""
    model_type: Optional[str] = None
    """config.json's model_type, which names the architecture when a config has no architectures list."""
    gguf: Optional[GgufFormat] = None
    """How a GGUF file of it is read; None: GGUF files of it are refused."""
