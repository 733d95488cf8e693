"""Multimodal checkpoints served text-only: Gemma 3 (4b / 12b / 27b-it) and Mistral Small 3.1 / 3.2 ship as
`...ForConditionalGeneration`, a vision tower and projector around a text model of a family already registered.

The config reader reads `text_config` (with what it lacks filled from the top level, as transformers' wrapper does)
through that family's reader; the names are the family's behind WeightsMapper rules for both prefixes the text model
is saved under (`language_model.model.` by older transformers and the hub files, `model.language_model.` by
current transformers), with the vision tower and projector dropped. Image inputs are refused by the server.
"""

import functools
from collections.abc import Callable

from jaxpaged.models.families import gemma, llama
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.weight_names import WeightNames, WeightsMapper

TEXT_TOWER_MAPPER = WeightsMapper(orig_to_new_prefix=(
    ("language_model.model.", "model."),  # older layout: the whole causal LM under language_model.
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),  # current transformers: the decoder under model.language_model.
    ("vision_tower.", None), ("model.vision_tower.", None),  # the image encoder: never read for text
    ("multi_modal_projector.", None), ("model.multi_modal_projector.", None),
))
"""Both wrapper layouts' text tensors renamed to the causal LM's names; vision tower and projector dropped."""

_TOP_LEVEL_WINS = ("eos_token_id", "tie_word_embeddings")
"""Keys the wrapper's own config decides when it sets them: transformers ties the wrapper's lm_head by its top-level
tie_word_embeddings, and the checkpoint's generation_config.json eos (weights/generation_config.py) lands there."""

_WRAPPER_ONLY = ("text_config", "vision_config", "architectures", "model_type")


def text_config_of(raw: dict) -> dict:
    """The text model's config of a multimodal wrapper config: its text_config, with the keys it lacks (vocab size,
    token ids) taken from the top level, and the top level's eos_token_id / tie_word_embeddings when set."""
    top = {key: value for key, value in raw.items() if key not in _WRAPPER_ONLY}
    text = raw.get("text_config") or {}
    return {**top, **text, **{key: raw[key] for key in _TOP_LEVEL_WINS if raw.get(key) is not None}}


def read_text_tower_config(raw: dict, architecture: str, *,
                           read_text: Callable[[dict, str], ModelConfig]) -> ModelConfig:
    """A multimodal wrapper's ModelConfig: its text model's, read by that family's `read_text`."""
    return read_text(text_config_of(raw), architecture)


def _text_tower_names(names: WeightNames) -> WeightNames:
    return WeightNames(names.layer, names.globals, names.layer_prefix, TEXT_TOWER_MAPPER)


ENTRIES = (
    ModelEntry("Gemma3ForConditionalGeneration",
               functools.partial(read_text_tower_config,
                                 read_text=functools.partial(gemma.read_gemma_config, qk_norm=True)),
               _text_tower_names(gemma.HF_NAMES), model_type="gemma3"),
    ModelEntry("Mistral3ForConditionalGeneration",
               functools.partial(read_text_tower_config,
                                 read_text=functools.partial(llama.read_llama_config, always_windowed=True)),
               _text_tower_names(llama.HF_NAMES), model_type="mistral3"),
)
"""This file's registry entries."""
