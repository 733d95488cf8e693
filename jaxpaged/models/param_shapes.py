"""Names and shapes of a decoder's parameters (stacked over layers), under the flat names the weight loaders produce.

The layer weights are the config's (ModelConfig.layer_shapes: the shared decoder's, Gemma's sandwich norms, a family
subclass's own). "post_norm" is the norm before the MLP in every family (HF's post_attention_layernorm for Llama, its
pre_feedforward_layernorm for Gemma).
"""

from jaxpaged.models.model_config import ModelConfig


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape under the flat names the weight loaders produce ("layers.q_proj", "embed", ...)."""
    shapes = {f"layers.{name}": (cfg.num_layers, *shape) for name, shape in cfg.layer_shapes().items()}
    shapes["embed"] = (cfg.vocab_size, cfg.hidden_size)
    shapes["final_norm"] = (cfg.hidden_size,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = (cfg.hidden_size, cfg.vocab_size)
    return shapes
