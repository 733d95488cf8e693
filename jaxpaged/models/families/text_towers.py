"""Multimodal checkpoints served text-only: Gemma 3 (4b / 12b / 27b-it) and Mistral Small 3.1 / 3.2 ship as
`...ForConditionalGeneration`, a vision tower and projector around a text model of a family already registered.

The config reader reads `text_config` (with what it lacks filled from the top level, as transformers' wrapper does)
through that family's reader; the names are the family's behind WeightsMapper rules for both prefixes the text model
is saved under (`language_model.model.` by older transformers and the hub files, `model.language_model.` by
current transformers), with the vision tower and projector dropped. Image inputs are refused by the server.
"""

import functools
from collections.abc import Callable
from typing import Optional

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

GEMMA3_TEXT_DEFAULTS: dict = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072,
    rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
    query_pre_attn_scalar=256, sliding_window=4096, sliding_window_pattern=6, rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0)
"""transformers' Gemma3TextConfig defaults: the hub's Gemma 3 4b / 12b / 27b configs list only what differs (4b's
text_config is hidden_size, intermediate_size, num_hidden_layers, rope_scaling and sliding_window)."""


def text_config_of(raw: dict, defaults: Optional[dict] = None) -> dict:
    """The text model's config of a multimodal wrapper config: its text_config, with the keys it lacks taken from
    the top level (vocab size, token ids), then from the text model's `defaults`; the top level's eos_token_id and
    tie_word_embeddings win when set."""
    top = {key: value for key, value in raw.items() if key not in _WRAPPER_ONLY}
    text = raw.get("text_config") or {}
    return {**(defaults or {}), **top, **text,
            **{key: raw[key] for key in _TOP_LEVEL_WINS if raw.get(key) is not None}}


def read_text_tower_config(raw: dict, architecture: str, *, read_text: Callable[[dict, str], ModelConfig],
                           defaults: Optional[dict] = None) -> ModelConfig:
    """A multimodal wrapper's ModelConfig: its text model's (text_config_of), read by that family's `read_text`."""
    return read_text(text_config_of(raw, defaults), architecture)


def _text_tower_names(names: WeightNames) -> WeightNames:
    return WeightNames(names.layer, names.globals, names.layer_prefix, TEXT_TOWER_MAPPER)


ENTRIES = (
    ModelEntry("Gemma3ForConditionalGeneration",
               functools.partial(read_text_tower_config,
                                 read_text=functools.partial(gemma.read_gemma_config, qk_norm=True),
                                 defaults=GEMMA3_TEXT_DEFAULTS),
               _text_tower_names(gemma.HF_NAMES), model_type="gemma3"),
    ModelEntry("Mistral3ForConditionalGeneration",
               functools.partial(read_text_tower_config,
                                 read_text=functools.partial(llama.read_llama_config, always_windowed=True)),
               _text_tower_names(llama.HF_NAMES), model_type="mistral3"),
)
"""This file's registry entries."""
