"""A checkpoint's generation_config.json: its EOS ids and its recommended sampling settings.

config.json's eos_token_id is often only the base model's end-of-text token, while generation_config.json lists
every token the chat model ends a turn with (Llama 3's <|eot_id|>, for one); HF's generate stops on the latter, so
jaxpaged does too.
"""

import json
import pathlib
from typing import Any

GENERATION_CONFIG_FILE = "generation_config.json"

SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "min_p", "typical_p", "repetition_penalty",
                 "presence_penalty", "frequency_penalty", "max_new_tokens")
"""The keys kept as sampling defaults, each only when the file sets it (HF semantics: do_sample false means
greedy whatever the temperature says)."""


def read_generation_config(directory: pathlib.Path) -> dict[str, Any]:
    """The file's contents, or {} when the directory has none; ValueError when it is not valid JSON."""
    path = directory / GENERATION_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    return raw if isinstance(raw, dict) else {}


def with_generation_eos(hf_config: dict, generation_config: dict[str, Any]) -> dict:
    """hf_config with eos_token_id replaced by the generation config's (an int or a list), when it sets one."""
    eos = generation_config.get("eos_token_id")
    if eos is None or eos == []:
        return hf_config
    return {**hf_config, "eos_token_id": eos}


OVERRIDABLE_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""The generation-config keys that become defaults of requests that leave them unset (vLLM's choice; do_sample and
max_new_tokens are not used)."""


def request_defaults(generation_defaults: dict[str, Any]) -> dict[str, Any]:
    """The SamplingParams fields a request inherits from the model when it does not set them."""
    return {key: generation_defaults[key] for key in OVERRIDABLE_SAMPLING_FIELDS if key in generation_defaults}


def sampling_defaults(generation_config: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings the model's authors recommend, as set in the file."""
    return {key: generation_config[key] for key in SAMPLING_KEYS if generation_config.get(key) is not None}
