"""Speculative decoding's options (EngineConfig.speculative; docs/speculative-decoding.md) and vLLM's
speculative_config mapping onto them."""

import dataclasses
from collections.abc import Mapping
from typing import Literal, Optional, get_args

from jaxpaged.checks import is_int
from jaxpaged.checks import require as _require

SpeculativeMethod = Literal["ngram", "draft_model"]
_SPECULATIVE_METHODS = get_args(SpeculativeMethod)


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (docs/speculative-decoding.md): decode rows carry proposed tokens that the step verifies.
    Field names are vLLM's speculative_config keys (prompt_lookup_*, num_speculative_tokens, disable_by_batch_size
    with a speculative_ prefix)."""

    speculative_method: Optional[SpeculativeMethod] = None
    """None: off. "ngram": prompt lookup, proposals copied from where the request's latest tokens occurred before.
    "draft_model": a smaller model with the same tokenizer (speculative_model) proposes its greedy tokens."""
    speculative_model: Optional[str] = None
    """The draft model of "draft_model" (vLLM's "model" key): an HF directory, a .gguf file, a converted checkpoint
    or a Hub id, as the target model. Given without a method, the method is "draft_model" (as vLLM infers it)."""
    num_speculative_tokens: int = 4
    """Most tokens proposed per request per step (each verification row is one token of the step's budget)."""
    prompt_lookup_min: int = 2
    """Shortest suffix n-gram the n-gram proposer matches."""
    prompt_lookup_max: int = 4
    """Longest suffix n-gram it tries first."""
    speculative_measure_cost: bool = True
    """A draft model proposes only at the batch sizes where steps with proposals measure cheaper per emitted token
    than steps without (speculative/step_cost.py; n-gram lookup costs next to nothing and is not metered)."""
    speculative_disable_by_batch_size: int = 16
    """No proposals while this many requests or more run or wait (vLLM counts the enqueued requests): a large batch
    keeps the device busy, and verifying rejected tokens then costs more than it saves (measured in
    docs/speculative-decoding.md)."""

    def __post_init__(self) -> None:
        if self.speculative_method is None and self.speculative_model is not None:
            object.__setattr__(self, "speculative_method", "draft_model")
        _require(self.speculative_method is None or self.speculative_method in _SPECULATIVE_METHODS,
                 "speculative_method", f"must be one of {_SPECULATIVE_METHODS} or None, got "
                 f"{self.speculative_method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                     "speculative_disable_by_batch_size"):
            value = getattr(self, name)
            _require(is_int(value) and value >= 1, name, f"must be a positive int, got {value!r}")
        _require(isinstance(self.speculative_measure_cost, bool), "speculative_measure_cost",
                 f"must be a bool, got {self.speculative_measure_cost!r}")
        _require(self.prompt_lookup_min <= self.prompt_lookup_max, "prompt_lookup_min",
                 f"must be <= prompt_lookup_max ({self.prompt_lookup_max}), got {self.prompt_lookup_min}")
        if self.speculative_method == "draft_model":
            _require(isinstance(self.speculative_model, str) and self.speculative_model != "", "speculative_model",
                     f"speculative_method \"draft_model\" needs the draft model's path or Hub id, got "
                     f"{self.speculative_model!r}")
        else:
            _require(self.speculative_model is None, "speculative_model",
                     f"only speculative_method \"draft_model\" reads a model, got method "
                     f"{self.speculative_method!r}")

    @property
    def enabled(self) -> bool:
        return self.speculative_method is not None

    @property
    def max_tokens_per_step(self) -> int:
        """Most proposals one step verifies: k for each of the most running requests that still propose
        (speculative_disable_by_batch_size - 1); the scheduler also keeps sequences plus proposals within
        max_num_seqs, the sampling rows every bucket has anyway."""
        if not self.enabled:
            return 0
        return (self.speculative_disable_by_batch_size - 1) * self.num_speculative_tokens


VLLM_SPECULATIVE_KEYS = {"method": "speculative_method", "model": "speculative_model",
                         "num_speculative_tokens": "num_speculative_tokens",
                         "prompt_lookup_min": "prompt_lookup_min", "prompt_lookup_max": "prompt_lookup_max",
                         "disable_by_batch_size": "speculative_disable_by_batch_size"}


def flat_speculative_config(value: object) -> dict[str, object]:
    """vLLM's speculative_config mapping ({"method": "ngram", "num_speculative_tokens": 4, ...}) as flat options."""
    if value is None:
        return {}
    _require(isinstance(value, Mapping), "speculative_config", f"must be a mapping, got {value!r}")
    assert isinstance(value, Mapping)
    unknown = sorted(set(value) - set(VLLM_SPECULATIVE_KEYS))
    _require(not unknown, "speculative_config", f"unknown keys {unknown}; known: {sorted(VLLM_SPECULATIVE_KEYS)}")
    return {VLLM_SPECULATIVE_KEYS[key]: item for key, item in value.items()}
