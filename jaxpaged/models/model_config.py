"""ModelConfig: the architecture facts the engine needs, read from an HF config (dict or PretrainedConfig)."""

import dataclasses
from typing import Any, Optional

# HF architecture name -> (qkv bias, q/k RMSNorm). The four supported members of the Llama family.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency-dependent RoPE scaling."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a Llama-family decoder."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    """Qwen2 adds a bias to the q, k and v projections."""
    qk_norm: bool = False
    """Qwen3 RMS-normalises each head of q and k before RoPE."""
    rope_scaling: Optional[RopeScaling] = None
    sliding_window: Optional[int] = None
    """Mistral's attention window, if the checkpoint enables one."""
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_q_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf_config: Any) -> "ModelConfig":
        """Read an HF config (PretrainedConfig or its dict); ValueError for unsupported architectures."""
        raw = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
        architecture = (raw.get("architectures") or [_architecture_from_type(raw.get("model_type"))])[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture: {architecture!r} is not supported; "
                             f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
        qkv_bias, qk_norm = SUPPORTED_ARCHITECTURES[architecture]
        num_q_heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_q_heads
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        window = raw.get("sliding_window")
        if architecture != "MistralForCausalLM" and not raw.get("use_sliding_window", False):
            window = None  # Qwen configs carry a window they do not use unless use_sliding_window is set.
        return cls(
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_q_heads=num_q_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_q_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias or bool(raw.get("attention_bias", False)),
            qk_norm=qk_norm,
            rope_scaling=_rope_scaling(rope),
            sliding_window=window,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _architecture_from_type(model_type: Optional[str]) -> str:
    by_type = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    return by_type.get(model_type or "", f"<model_type {model_type!r}>")


def _rope_scaling(rope: dict) -> Optional[RopeScaling]:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"rope_scaling: type {kind!r} is not supported (only 'default' and 'llama3')")
    return RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                       float(rope["high_freq_factor"]), int(rope["original_max_position_embeddings"]))
