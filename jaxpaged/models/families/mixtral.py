"""Mixtral (MixtralForCausalLM), as transformers' models/mixtral defines it: Mistral's attention (a sliding window
whenever the config sets one) and a mixture of SiLU-gated experts in place of the MLP, routed by softmax, top-k and
renormalisation of the kept weights, with no biases.

Checkpoints name the experts one tensor per expert, `block_sparse_moe.experts.N.w1/w2/w3.weight` (w1 the gate, w3 the
up projection, w2 the down one) beside the router `block_sparse_moe.gate.weight` (the hub's files, and what
transformers 5's save_pretrained writes); transformers 5's in-memory layout, fused `mlp.experts.gate_up_proj`
[E, 2 * intermediate, hidden] (gate half first) and `mlp.experts.down_proj` [E, hidden, intermediate] with the router
at `mlp.gate.weight`, loads too.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxpaged.models.expert_layouts import FusedExpertTensor, PerExpertTensors, one_of
from jaxpaged.models.families import moe_stopgap
from jaxpaged.models.families.llama import HF_NAMES as LLAMA_HF_NAMES
from jaxpaged.models.families.llama import read_llama_config
from jaxpaged.models.layers import matmul
from jaxpaged.models.llama import LlamaForCausalLM
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.model_entry import ModelEntry
from jaxpaged.models.weight_names import CheckpointTensor, WeightNames

_T = CheckpointTensor
_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class MixtralConfig(ModelConfig):
    """Mixtral's decoder: ModelConfig (intermediate_size is each expert's width) plus its experts."""

    num_experts: int = 0
    num_experts_per_tok: int = 0

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Mistral's attention, the router and the experts (gate and up fused)."""
        shapes = {name: shape for name, shape in super().layer_shapes().items() if name not in _DENSE_MLP}
        hidden, experts, inter = self.hidden_size, self.num_experts, self.intermediate_size
        return shapes | {"router": (hidden, experts), "experts_gate_up": (experts, hidden, 2 * inter),
                         "experts_down": (experts, inter, hidden)}


def read_mixtral_config(raw: dict, architecture: str) -> MixtralConfig:
    """A MixtralConfig from an HF config dict."""
    base = read_llama_config(raw, architecture, always_windowed=True)
    return MixtralConfig(**{field.name: getattr(base, field.name) for field in dataclasses.fields(base)},
                         num_experts=int(raw["num_local_experts"]),
                         num_experts_per_tok=int(raw["num_experts_per_tok"]))


class MixtralForCausalLM(LlamaForCausalLM):
    """The shared decoder with Mixtral's mixture-of-experts block."""

    cfg: MixtralConfig

    def feed_forward(self, h: Float[Array, "num_tokens hidden"], w: dict[str, Any], proj: Callable,
                     num_rows: Int[Array, ""]) -> Float[Array, "num_tokens hidden"]:
        """Route each token to its top experts (softmax, top-k, renormalised) and sum their SwiGLU outputs."""
        logits = matmul(h, proj("router"), out_dtype=jnp.float32, num_rows=num_rows)
        ids, weights = moe_stopgap.route(logits, self.cfg.num_experts_per_tok, "softmax_topk_renorm")
        return moe_stopgap.moe_mlp(h, ids, weights, w["experts_gate_up"], w["experts_down"],
                                   moe_stopgap.silu_gated, num_rows)


_PER_EXPERT = "block_sparse_moe.experts.{expert}."

HF_NAMES = WeightNames(
    layer={**{name: tensor for name, tensor in LLAMA_HF_NAMES.layer.items() if name not in _DENSE_MLP},
           "router": one_of(_T("block_sparse_moe.gate.weight", True), _T("mlp.gate.weight", True)),
           "experts_gate_up": one_of(
               PerExpertTensors(_PER_EXPERT + "w1.weight", True, also=(_PER_EXPERT + "w3.weight",)),
               FusedExpertTensor("mlp.experts.gate_up_proj", True)),
           "experts_down": one_of(PerExpertTensors(_PER_EXPERT + "w2.weight", True),
                                  FusedExpertTensor("mlp.experts.down_proj", True))},
    globals=LLAMA_HF_NAMES.globals,
)
"""transformers' MixtralForCausalLM names: per-expert tensors, or transformers 5's fused ones."""

ENTRIES = (
    ModelEntry("MixtralForCausalLM", read_mixtral_config, HF_NAMES, model_class=MixtralForCausalLM,
               model_type="mixtral"),
)
"""This family's registry entries."""
