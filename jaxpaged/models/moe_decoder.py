"""The shared decoder with mixture-of-experts MLPs: MoeModelConfig (the MoE fields every MoE family reads, the
router and experts in layer_shapes) and MoeForCausalLM (LlamaForCausalLM with feed_forward running models/moe.py).

Layers with experts and dense layers mixed (Qwen3-MoE's mlp_only_layers, decoder_sparse_step): every layer holds
both the dense MLP's weights and the experts', zeros where the checkpoint has none, plus a per-layer flag that picks
the block with lax.cond (one branch runs). The stacked, scanned arrangement needs layers of one shape, and the loader,
the sharding and the memory plan all work per parameter name over every layer; splitting the scan by layer kind
would touch all of them. The cost is memory for the zeros, and only where a model mixes kinds: the released
Qwen3-MoE and Mixtral checkpoints have experts in every layer, and then no dense weights or flag exist at all.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxpaged.models.int8_weights import Int8Weight, scale_name
from jaxpaged.models.layers import gated_mlp, matmul
from jaxpaged.models.llama import LayerWeight, LlamaForCausalLM
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.moe import EXPERT_ACTIVATIONS, Activation, ExpertWeights, MoeRouting, moe_block

DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class MoeModelConfig(ModelConfig):
    """A decoder whose MLPs are mixtures of experts (in every layer, or where expert_layers says)."""

    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    """Each expert's intermediate width (intermediate_size stays the dense layers')."""
    routing_style: str = "softmax_topk"
    """models/moe.py ROUTING_STYLES."""
    norm_topk_prob: bool = False
    """softmax_topk: renormalise the top-k weights to sum to 1."""
    expert_layers: tuple[bool, ...] = ()
    """Per layer: whether it has experts; empty: every layer has."""
    router_bias: bool = False
    expert_biases: bool = False
    """gate/up/down biases per expert (gpt-oss)."""
    expert_activation: str = "silu"
    """models/moe.py EXPERT_ACTIVATIONS."""
    shared_expert_size: int = 0
    """Qwen2-MoE: a gated MLP of this width every token runs beside its experts, scaled by sigmoid(x @
    shared_expert_gate); 0: none."""
    expert_parallel: bool = False
    """EngineConfig.enable_expert_parallel: under tp > 1, whole experts per model shard (else every expert's
    intermediate axis split, as the dense MLP's)."""
    expert_data_parallel: int = 1
    """With expert_parallel and data_parallel_size > 1: the data-parallel ranks the experts also span (they step in
    lock step, runner/lock_step.py; num_experts / (dp * tp) per device); 1 otherwise."""

    @property
    def routing(self) -> MoeRouting:
        """The routing models/moe.py runs."""
        return MoeRouting(self.num_experts, self.num_experts_per_tok, self.routing_style, self.norm_topk_prob)

    def layer_has_experts(self, layer: int) -> bool:
        """Whether decoder layer `layer` runs a mixture of experts (else the dense gated MLP)."""
        return not self.expert_layers or self.expert_layers[layer]

    @property
    def mixes_dense_layers(self) -> bool:
        """Some layers have experts and some do not (both kinds of weights are stored: the module docstring)."""
        return bool(self.expert_layers) and not all(self.expert_layers)

    @property
    def has_experts(self) -> bool:
        """At least one layer has experts."""
        return self.num_experts > 0 and (not self.expert_layers or any(self.expert_layers))

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shared decoder's shapes with the router [hidden, E] and the experts [E, in, out] (and their biases);
        the dense MLP's only when some layers are dense, plus the per-layer flag "expert_layer" when kinds mix."""
        shapes = super().layer_shapes()
        if not self.has_experts:
            return shapes
        if not self.mixes_dense_layers:
            for name in DENSE_MLP:
                del shapes[name]
        hidden, experts, inner = self.hidden_size, self.num_experts, self.moe_intermediate_size
        shapes.update(router=(hidden, experts), expert_gate=(experts, hidden, inner),
                      expert_up=(experts, hidden, inner), expert_down=(experts, inner, hidden))
        if self.router_bias:
            shapes["router_bias"] = (experts,)
        if self.expert_biases:
            shapes.update(expert_gate_bias=(experts, inner), expert_up_bias=(experts, inner),
                          expert_down_bias=(experts, hidden))
        if self.shared_expert_size:
            shared = self.shared_expert_size
            shapes.update(shared_gate=(hidden, shared), shared_up=(hidden, shared), shared_down=(shared, hidden),
                          shared_expert_gate=(hidden, 1))
        if self.mixes_dense_layers:
            shapes["expert_layer"] = (1,)  # one value per layer (a 0-d layer would not stack)
        return shapes


def moe_fields(base: ModelConfig) -> dict[str, Any]:
    """A ModelConfig's fields as keyword arguments (for a family reader building a MoeModelConfig from its dense
    reader's result; dataclasses.asdict would turn the RoPE scaling into a dict)."""
    return {field.name: getattr(base, field.name) for field in dataclasses.fields(ModelConfig)}


def with_expert_parallel(model: ModelConfig, enabled: bool, data_parallel_size: int = 1) -> ModelConfig:
    """`model` with EngineConfig.enable_expert_parallel applied, the experts over `data_parallel_size` ranks too when
    it is on (a dense model is returned as it is)."""
    if not isinstance(model, MoeModelConfig):
        return model
    expert_data_parallel = data_parallel_size if enabled and model.has_experts else 1
    if (model.expert_parallel, model.expert_data_parallel) == (enabled, expert_data_parallel):
        return model
    return dataclasses.replace(model, expert_parallel=enabled, expert_data_parallel=expert_data_parallel)


def runs_in_lock_step(model: ModelConfig, enable_expert_parallel: bool, data_parallel_size: int) -> bool:
    """Whether the data-parallel ranks step as one program: a model with experts placed over dp x tp devices."""
    return isinstance(model, MoeModelConfig) and model.has_experts and enable_expert_parallel and data_parallel_size > 1


def expert_weight(w: dict[str, Any], name: str) -> Any:
    """One expert stack as moe.py takes it: the float [E, in, out], or Int8Weight with its scales [E, out]."""
    scale = w.get(scale_name(name))
    return w[name] if scale is None else Int8Weight(w[name], scale)


class MoeForCausalLM(LlamaForCausalLM):
    """The shared decoder with mixture-of-experts MLPs (MoeModelConfig)."""

    takes_mesh = True
    """runner/compiled_step.py place_model hands it the rank's mesh."""

    def __init__(self, cfg: ModelConfig, params: dict[str, LayerWeight], packed: bool = False,
                 int8_matmul: Optional[str] = None, mesh: Optional[jax.sharding.Mesh] = None):
        """As LlamaForCausalLM; `mesh`: the rank's mesh (or the lock-step ranks' (dp, tp) one), over which the
        experts run per shard when it has several devices."""
        super().__init__(cfg, params, packed=packed, int8_matmul=int8_matmul)
        self.expert_mesh = mesh if mesh is not None and mesh.size > 1 else None

    def expert_activation(self) -> Activation:
        """The experts' (gate, up) -> down input: the config's named one (a family with constants of its own, such
        as gpt-oss's clamped SwiGLU, overrides this)."""
        assert isinstance(self.cfg, MoeModelConfig)
        return EXPERT_ACTIVATIONS[self.cfg.expert_activation]

    def feed_forward(self, h: Float[Array, "num_tokens hidden"], w: dict[str, Any], proj: Callable,
                     num_rows: Int[Array, ""]) -> Float[Array, "num_tokens hidden"]:
        """The layer's mixture of experts (or, on a dense layer of a model mixing kinds, the gated MLP)."""
        cfg = self.cfg
        assert isinstance(cfg, MoeModelConfig)
        if not cfg.has_experts:
            return super().feed_forward(h, w, proj, num_rows)

        def experts_block(h):
            logits = matmul(h, proj("router"), out_dtype=jnp.float32, num_rows=num_rows)
            if cfg.router_bias:
                logits = logits + w["router_bias"].astype(jnp.float32)
            experts = ExpertWeights(expert_weight(w, "expert_gate"), expert_weight(w, "expert_up"),
                                    expert_weight(w, "expert_down"), w.get("expert_gate_bias"),
                                    w.get("expert_up_bias"), w.get("expert_down_bias"))
            out = moe_block(h, logits, experts, cfg.routing, num_rows,
                            activation=self.expert_activation(), mesh=self.expert_mesh,
                            expert_parallel=cfg.expert_parallel)
            if not cfg.shared_expert_size:
                return out
            shared = gated_mlp(h, proj("shared_gate"), proj("shared_up"), proj("shared_down"), "silu", num_rows)
            shared_gate = jax.nn.sigmoid(matmul(h, proj("shared_expert_gate"), out_dtype=jnp.float32))
            return (out.astype(jnp.float32) + shared_gate * shared.astype(jnp.float32)).astype(out.dtype)

        if not cfg.mixes_dense_layers:
            return experts_block(h)
        dense = super().feed_forward
        return jax.lax.cond(w["expert_layer"][0] > 0, experts_block, lambda h: dense(h, w, proj, num_rows), h)
