"""TPU: a mixture of experts' weight stacks padded to whole 128-lane columns once, when they are placed.

XLA:TPU lays out a [experts, k, n] weight whose n is not a multiple of 128 with the experts minor, and copies the
whole tensor to row-major for every Pallas grouped-matmul call that reads it (pallas_kernels/grouped_matmul/
weight_layout.py; docs/tpu-compile.md, "The MoE grouped matmul"): every expert read and written per step rather than
the touched ones read once. gpt-oss's width and hidden size (2880) are such an n, and so is any width tensor
parallelism splits into slices of other than whole lanes (Qwen3-30B-A3B's 768 at tp 8). So the expert width (gate
and up's columns, down's rows, their biases and scales) is padded with zeros to whole lanes per shard, and the
hidden size (down's columns and scales) to whole lanes; models/moe.py drops down's extra output columns. Zero gate
and up columns meet zero down rows, so the result is unchanged whatever the activation makes of them.

The padding is a view (runner/zero_padded.py): each device's shard is cut and zero-filled as place_params places
it, so the host never holds a padded copy of the experts.
"""

from collections.abc import Mapping

from jaxpaged.models.int8_weights import scale_name
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.moe_decoder import MoeModelConfig
from jaxpaged.runner.zero_padded import HostWeight, ZeroPadded
from pallas_kernels.grouped_matmul import lane_padded_width

_WIDTH, _HIDDEN = "width", "hidden"
# Stacked expert parameter -> what its trailing axes are (the down bias is added after the columns are dropped).
_PADDED_AXES: dict[str, tuple[str, ...]] = {
    "layers.expert_gate": (_WIDTH,), "layers.expert_up": (_WIDTH,), "layers.expert_down": (_WIDTH, _HIDDEN),
    "layers.expert_gate_bias": (_WIDTH,), "layers.expert_up_bias": (_WIDTH,),
    scale_name("layers.expert_gate"): (_WIDTH,), scale_name("layers.expert_up"): (_WIDTH,),
    scale_name("layers.expert_down"): (_HIDDEN,)}


def pad_experts_to_lanes(params: Mapping[str, HostWeight], model: ModelConfig, tp: int) -> Mapping[str, HostWeight]:
    """`params` with each expert stack padded to whole 128-lane columns (a ZeroPadded view; other parameters and a
    dense model's are returned as they are): the width per shard when tensor parallelism splits it (no expert
    parallelism), the hidden size whole."""
    if not isinstance(model, MoeModelConfig) or not model.has_experts:
        return params
    width_shards = 1 if model.expert_parallel else tp
    padded_size = {_WIDTH: lane_padded_width(model.moe_intermediate_size, width_shards),
                   _HIDDEN: lane_padded_width(model.hidden_size)}
    out = dict(params)
    for name, axes in _PADDED_AXES.items():
        value = params.get(name)
        if value is None:
            continue
        shape = (*value.shape[:-len(axes)], *(padded_size[axis] for axis in axes))
        if shape != value.shape:
            out[name] = ZeroPadded(value, shape)
    return out
