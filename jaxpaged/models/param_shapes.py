"""Names and shapes of a decoder's parameters (stacked over layers): the shared decoder's layer weights here, a
family's own (Gemma's sandwich norms, a mixture of experts' router) from its registry entry (ModelEntry.layer_shapes).

"post_norm" is the norm before the MLP in every family (HF's post_attention_layernorm for Llama, its
pre_feedforward_layernorm for Gemma).
"""

from jaxpaged.models.model_config import ModelConfig


def layer_param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes of one layer's weights in the shared decoder: attention (with q/k/v biases, q/k norms when `cfg` has
    them) and the gated MLP (stacked over layers they gain a leading num_layers axis)."""
    hidden, q_dim, kv_dim = cfg.hidden_size, cfg.num_q_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes = {
        "input_norm": (hidden,), "q_proj": (hidden, q_dim), "k_proj": (hidden, kv_dim), "v_proj": (hidden, kv_dim),
        "o_proj": (q_dim, hidden), "post_norm": (hidden,), "gate_proj": (hidden, cfg.intermediate_size),
        "up_proj": (hidden, cfg.intermediate_size), "down_proj": (cfg.intermediate_size, hidden),
    }
    if cfg.qkv_bias:
        shapes.update(q_bias=(q_dim,), k_bias=(kv_dim,), v_bias=(kv_dim,))
    if cfg.qk_norm:
        shapes.update(q_norm=(cfg.head_dim,), k_norm=(cfg.head_dim,))
    return shapes


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape under the flat names the weight loaders produce ("layers.q_proj", "embed", ...); the
    layer weights are those of cfg.architecture's registry entry."""
    from jaxpaged.models.registry import resolve  # the registry's entries name this module's layer_param_shapes

    layer_shapes = resolve(cfg.architecture).layer_shapes(cfg)
    shapes = {f"layers.{name}": (cfg.num_layers, *shape) for name, shape in layer_shapes.items()}
    shapes["embed"] = (cfg.vocab_size, cfg.hidden_size)
    shapes["final_norm"] = (cfg.hidden_size,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.hidden_size, cfg.vocab_size)
    return shapes
