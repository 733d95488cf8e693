"""Random-weight models a bench config names as `model: random:NAME`, made at run time (once, cached on disk) as HF
checkpoints beside the embedded model's tokenizer, so jaxpaged and the HF peers load the same files.

The MoE pair measures what issue 58 asks: a Qwen3-MoE-shaped model of ~0.5B total parameters (64 experts, top 8) and
a dense Qwen3 with the same active parameters per token (its MLP as wide as the 8 chosen experts together).
"""

import pathlib
import shutil
import tempfile
from typing import Any

PREFIX = "random:"

_SHARED: dict[str, Any] = dict(vocab_size=49152, hidden_size=1024, num_hidden_layers=12, num_attention_heads=16,
                               num_key_value_heads=8, head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-6,
                               tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)

RANDOM_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    # 12 x 64 experts x 3 x 1024 x 256 = 604M expert weights (+ 50M attention, 50M embedding): ~0.7B total;
    # per token 8 experts: ~50M of expert weights.
    "qwen3_moe_0.7b": ("Qwen3MoeConfig", _SHARED | dict(intermediate_size=2048, moe_intermediate_size=256,
                                                          num_experts=64, num_experts_per_tok=8, norm_topk_prob=True)),
    # The same attention and embedding, one MLP of 8 x 256: the MoE's active parameters per token.
    "qwen3_dense_0.7b_active": ("Qwen3Config", _SHARED | dict(intermediate_size=8 * 256)),
}
"""name -> (transformers config class, its arguments)."""


def is_random_model(model: object) -> bool:
    """Whether a config's `model` names a random model."""
    return isinstance(model, str) and model.startswith(PREFIX)


def materialize(model: str, cache_root: pathlib.Path, specs: "dict[str, tuple[str, dict[str, Any]]] | None" = None,
                ) -> str:
    """The directory of random model `model` ("random:NAME"), written under cache_root on first use (seeded, so
    every run measures the same weights); ValueError naming `model` for an unknown NAME."""
    specs = RANDOM_MODELS if specs is None else specs
    name = model[len(PREFIX):]
    if name not in specs:
        raise ValueError(f"model: {model!r} is no random model (known: {[PREFIX + key for key in sorted(specs)]})")
    target = cache_root / name
    if (target / "config.json").is_file():
        return str(target)
    import torch
    import transformers

    from jaxpaged.weights.loader import locate_model

    config_class, arguments = specs[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**arguments)
    hf_model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    cache_root.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_root))
    try:
        hf_model.save_pretrained(scratch)
        tokenizer_dir = locate_model(None)[0]
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / file, scratch / file)
        scratch.rename(target)  # whole or not at all: a later run never reads a half-written model
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)
