"""ModelConfig: the architecture facts the engine needs, read from an HF config (dict or PretrainedConfig)."""

import dataclasses
from typing import Any, Optional

# HF architecture name -> (qkv bias, q/k RMSNorm). The Llama family, and Gemma 2 / 3 (text), whose other
# differences (GELU, (1 + w) norms, sandwich norms, soft-capping, alternating windows) are read in _gemma().
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
    "Gemma2ForCausalLM": (False, False),
    "Gemma3ForCausalLM": (False, True),
}
_GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")


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
    """Attention window (Mistral; Gemma's local layers), if the checkpoint enables one."""
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    # ---- Gemma 2 / 3 (the defaults are Llama's) ----
    layer_is_sliding: tuple[bool, ...] = ()
    """Per layer: whether it uses sliding_window. Empty: every layer does (when sliding_window is set)."""
    local_rope_theta: Optional[float] = None
    """RoPE base of the sliding-window layers when it differs from rope_theta (Gemma 3)."""
    rope_linear_factor: float = 1.0
    """Linear RoPE scaling of the global layers (positions divided by it; Gemma 3's larger models)."""
    norm_offset: float = 0.0
    """RMSNorm scales by (norm_offset + w): Gemma stores w - 1."""
    sandwich_norms: bool = False
    """Gemma: the attention and MLP outputs are normalised again before the residual add."""
    hidden_activation: str = "silu"
    """The gated MLP's activation: "silu" or "gelu_tanh"."""
    embed_scale: Optional[float] = None
    """Gemma multiplies the token embeddings by sqrt(hidden_size)."""
    attn_scale: Optional[float] = None
    """Softmax scale of q.k; None is head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)."""
    attn_soft_cap: Optional[float] = None
    """Gemma 2 caps attention logits at soft_cap * tanh(logits / soft_cap)."""
    final_soft_cap: Optional[float] = None
    """Gemma 2 caps the output logits the same way."""

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
        rope = rope.get("full_attention", rope)  # Gemma 3: one set per layer type; the global layers' here
        rope_theta = rope.get("rope_theta", raw.get("rope_theta")) or 10000.0
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        window = raw.get("sliding_window")
        if architecture not in ("MistralForCausalLM", *_GEMMA) and not raw.get("use_sliding_window", False):
            window = None  # Qwen configs carry a window they do not use unless use_sliding_window is set.
        gemma = _gemma(raw, head_dim) if architecture in _GEMMA else {}
        return cls(**gemma,
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
            rope_scaling=_rope_scaling(rope) if rope.get("rope_type", rope.get("type")) != "linear" else None,
            sliding_window=window,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _gemma(raw: dict, head_dim: int) -> dict:
    """The Gemma-only fields of ModelConfig, as transformers' Gemma2/Gemma3 text models define them."""
    num_layers = raw["num_hidden_layers"]
    layer_types = raw.get("layer_types")
    if not layer_types:  # older configs: Gemma 2 alternates from layer 0; Gemma 3 has one global layer per pattern
        pattern = raw.get("sliding_window_pattern") or 2
        layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    rope = raw.get("rope_parameters") or {}
    local = rope.get("sliding_attention", {}) if "sliding_attention" in rope else {}
    global_rope = rope.get("full_attention", rope)
    scalar = raw.get("query_pre_attn_scalar") or head_dim
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"hidden_activation: {activation!r} is not supported for Gemma (only gelu_pytorch_tanh)")
    return dict(
        layer_is_sliding=tuple(kind == "sliding_attention" for kind in layer_types),
        local_rope_theta=local.get("rope_theta") or raw.get("rope_local_base_freq"),
        rope_linear_factor=float(global_rope.get("factor", 1.0)) if global_rope.get("rope_type") == "linear" else 1.0,
        norm_offset=1.0, sandwich_norms=True, hidden_activation="gelu_tanh",
        embed_scale=float(raw["hidden_size"]) ** 0.5, attn_scale=float(scalar) ** -0.5,
        attn_soft_cap=raw.get("attn_logit_softcapping"), final_soft_cap=raw.get("final_logit_softcapping"))


def _architecture_from_type(model_type: Optional[str]) -> str:
    by_type = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
    return by_type.get(model_type or "", f"<model_type {model_type!r}>")


def _rope_scaling(rope: dict) -> Optional[RopeScaling]:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"rope_scaling: type {kind!r} is not supported (only 'default' and 'llama3')")
    return RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                       float(rope["high_freq_factor"]), int(rope["original_max_position_embeddings"]))
