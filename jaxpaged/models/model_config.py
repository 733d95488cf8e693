"""ModelConfig: the architecture facts the engine needs, and the HF config fields every family reads alike.

Which architecture reads which fields is the registry's business (models/registry.py, models/families/).
"""

import dataclasses
from typing import Any, Optional, Union

from jaxpaged.models.yarn import YarnScaling, read_yarn


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency-dependent RoPE scaling."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of a decoder; a family's config reader (models/families/) fills it in."""

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
    rope_scaling: Optional[Union[RopeScaling, YarnScaling]] = None
    """Llama 3 or YaRN scaling of the global layers' RoPE frequencies."""
    sliding_window: Optional[int] = None
    """Attention window (Mistral; Gemma's local layers), if the checkpoint enables one."""
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    # ---- Decoder variants: the defaults are Llama's; a family's reader sets them (Gemma: families/gemma.py) ----
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
    def rope_attention_scale(self) -> float:
        """What the global layers' cos and sin are multiplied by: YaRN's attention factor, else 1."""
        return self.rope_scaling.cos_sin_scale() if isinstance(self.rope_scaling, YarnScaling) else 1.0

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_q_heads // self.num_kv_heads

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of one layer's weights (stacked over layers they gain a leading num_layers axis): attention (with
        q/k/v biases and q/k norms when set), the gated MLP, and Gemma's sandwich norms when set. A family with
        weights of its own (a mixture of experts' router and experts) overrides this in its ModelConfig subclass."""
        hidden, q_dim, kv_dim = self.hidden_size, self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes = {
            "input_norm": (hidden,), "q_proj": (hidden, q_dim), "k_proj": (hidden, kv_dim), "v_proj": (hidden, kv_dim),
            "o_proj": (q_dim, hidden), "post_norm": (hidden,), "gate_proj": (hidden, self.intermediate_size),
            "up_proj": (hidden, self.intermediate_size), "down_proj": (self.intermediate_size, hidden),
        }
        if self.qkv_bias:
            shapes.update(q_bias=(q_dim,), k_bias=(kv_dim,), v_bias=(kv_dim,))
        if self.qk_norm:
            shapes.update(q_norm=(self.head_dim,), k_norm=(self.head_dim,))
        if self.sandwich_norms:  # the attention and MLP outputs are normalised again before each residual add
            shapes.update(attn_out_norm=(hidden,), mlp_out_norm=(hidden,))
        return shapes


def decoder_fields(raw: dict, architecture: str) -> dict[str, Any]:
    """The ModelConfig fields every family reads the same way from an HF config dict (shapes, RoPE, token ids); a
    family's reader adds its own. Gemma 3 keeps one RoPE set per layer type: the global layers' is read here."""
    num_q_heads = raw["num_attention_heads"]
    rope = global_rope_parameters(raw)
    rope_theta = rope.get("rope_theta", raw.get("rope_theta")) or 10000.0
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    return dict(
        architecture=architecture,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_q_heads=num_q_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_q_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_q_heads,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_theta),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_scaling=(_rope_scaling(rope, raw.get("max_position_embeddings", 2048))
                      if rope.get("rope_type", rope.get("type")) != "linear" else None),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def global_rope_parameters(raw: dict) -> dict:
    """The RoPE parameters of the full-attention layers (transformers 5's rope_parameters, else rope_scaling)."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return rope.get("full_attention", rope)


def _rope_scaling(rope: dict, max_position_embeddings: int) -> Optional[Union[RopeScaling, YarnScaling]]:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind == "yarn":
        return read_yarn(rope, max_position_embeddings)
    if kind != "llama3":
        raise ValueError(f"rope_scaling: type {kind!r} is not supported (only 'default', 'llama3' and 'yarn')")
    return RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                       float(rope["high_freq_factor"]), int(rope["original_max_position_embeddings"]))
