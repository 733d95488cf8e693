"""vLLM's spellings of engine option values, read the way `vllm serve` reads them.

  - --max-model-len 32k / 32K / auto: vLLM's human-readable ints (lower-case suffixes are decimal, k = 1,000;
    upper-case ones binary, K = 1,024, and take no decimals) and "auto" (-1 too): the model's context, lowered to
    what the KV pool holds, which is jaxpaged's default (max_model_len None);
  - --dtype half / float: vLLM's names for float16 / float32;
  - a vLLM value jaxpaged lacks (--kv-cache-dtype fp8_e5m2, -q awq): an error naming the option and what jaxpaged
    supports, instead of argparse's bare "invalid choice".
"""

import re
from collections.abc import Sequence
from typing import Any, Optional

_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's --dtype names that jaxpaged spells otherwise."""
AUTO_MAX_MODEL_LEN = ("auto", "-1")
"""vLLM's --max-model-len values for "the longest context that fits"."""


def human_readable_int(text: str, field: str) -> int:
    """vLLM's human-readable int: "32k" = 32,000, "32K" = 32,768, "25.6k" = 25,600, "4096"; ValueError naming the
    field (a decimal with a binary suffix is refused, as vLLM does)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)([kKmMgGtT]?)\s*", text)
    if match is None:
        raise ValueError(f"{field}: must be an int such as 4096, 32k (32,000) or 32K (32,768), got {text!r}")
    number, suffix = match.groups()
    if suffix in _DECIMAL_SUFFIXES:
        return int(float(number) * _DECIMAL_SUFFIXES[suffix])
    if "." in number:
        raise ValueError(f"{field}: decimals take a decimal suffix (k, m, g, t) only, got {text!r}")
    return int(number) * _BINARY_SUFFIXES.get(suffix, 1)


def max_model_len(text: str) -> Optional[int]:
    """--max-model-len's value: an int in vLLM's human-readable form, or None for "auto"."""
    if text.strip().lower() in AUTO_MAX_MODEL_LEN:
        return None
    return human_readable_int(text, "max_model_len")


def choice(field: str, text: str, choices: Sequence[Any]) -> str:
    """A choice option's value with vLLM's aliases resolved; ValueError naming the field and the supported values
    when it is none of them."""
    value = DTYPE_ALIASES.get(text, text) if field == "dtype" else text
    if value not in choices:
        raise ValueError(f"{field}: {text!r} is not supported by jaxpaged; supported: {', '.join(map(str, choices))}")
    return value
