"""Stacked expert weights [E, in, out] from the checkpoint layouts MoE families ship (names as data, read through
weight_names.AssembledTensor by the HF loader):

  - per-expert 2-D tensors, one per expert and projection, torch's [out, in] (`mlp.experts.N.gate_proj.weight`:
    Qwen-MoE, and what transformers 5's save_pretrained writes for it; Mixtral's `block_sparse_moe.experts.N.w1`);
  - fused 3-D tensors [E, out, in] (`mlp.experts.gate_up_proj` [E, 2I, H] with the gate half first and
    `mlp.experts.down_proj` [E, H, I]: transformers 5's in-memory Qwen3-MoE layout).

A family lists each expert parameter's layouts in the order they are tried; a checkpoint with none of them, or with
some experts missing, gets a ValueError naming the tensor. Layers without experts (a model mixing dense and MoE
layers) hold zeros in the expert parameters and in the dense MLP's on MoE layers (see models/moe_decoder.py).
"""

import dataclasses
from typing import Any, Optional

import numpy as np

from jaxpaged.models.weight_names import AssembledTensor, TensorLookup


@dataclasses.dataclass(frozen=True)
class PerExpert:
    """One 2-D tensor per expert, stored [out, in]; `pattern` names it within a layer with {expert}."""

    pattern: str


@dataclasses.dataclass(frozen=True)
class Fused:
    """One 3-D tensor of every expert, stored [E, out, in] (`transposed` False: [E, in, out]), or a 2-D bias
    [E, out] (`transposed` False); this parameter is part `part` of `parts` equal slices of the out axis
    (gate_up_proj: gate is part 0 of 2), or with `interleaved` every parts-th column from `part` on (gpt-oss's
    gate_up_proj alternates gate and up columns)."""

    name: str
    part: int = 0
    parts: int = 1
    transposed: bool = True
    interleaved: bool = False


def expert_stack(param: str, *layouts: Any) -> AssembledTensor:
    """The AssembledTensor of expert parameter `param` ("expert_gate") [E, in, out], read from the first of
    `layouts` the checkpoint has (PerExpert or Fused); zeros on a layer without experts (cfg.layer_has_experts)."""

    def build(lookup: TensorLookup, prefix: str, layer: int, cfg: Any) -> np.ndarray:
        if not cfg.layer_has_experts(layer):
            return np.zeros(cfg.layer_shapes()[param], np.float32)
        for layout in layouts:
            stacked = _read(layout, lookup, prefix, cfg.num_experts)
            if stacked is not None:
                return stacked
        tried = " or ".join(repr(prefix + _first_name(layout)) for layout in layouts)
        raise ValueError(f"tensor {tried} is missing: no expert layout this family reads")

    return AssembledTensor(build)


def on_layers_of_kind(param: str, name: str, with_experts: bool, transpose: bool = True) -> AssembledTensor:
    """Parameter `param` of a model mixing dense and MoE layers that only one kind of layer has (the router:
    `with_experts`; the dense MLP's gate_proj: not): the checkpoint's tensor `name` on those layers (torch's
    [out, in] transposed when `transpose`), zeros on the others."""

    def build(lookup: TensorLookup, prefix: str, layer: int, cfg: Any) -> np.ndarray:
        if cfg.layer_has_experts(layer) != with_experts:
            return np.zeros(cfg.layer_shapes()[param], np.float32)
        value = lookup(prefix + name)
        if value is None:
            raise ValueError(f"tensor {prefix + name!r} is missing")
        return value.T if transpose else value

    return AssembledTensor(build)


def first_of(*names: str, transpose: bool = True) -> AssembledTensor:
    """A layer tensor checkpoints spell in more than one way (Mixtral's router: `block_sparse_moe.gate.weight` in
    the hub's files, `mlp.gate.weight` in transformers 5's layout): the first of `names` present (torch's [out, in]
    transposed when `transpose`); ValueError naming them all when none is."""

    def build(lookup: TensorLookup, prefix: str, layer: int, cfg: Any) -> np.ndarray:
        for name in names:
            value = lookup(prefix + name)
            if value is not None:
                return value.T if transpose else value
        raise ValueError(f"tensor {' or '.join(repr(prefix + name) for name in names)} is missing")

    return AssembledTensor(build)


def layer_flag() -> AssembledTensor:
    """1.0 on a layer with experts, 0.0 on a dense one (read by the model to pick the layer's MLP)."""
    return AssembledTensor(lambda lookup, prefix, layer, cfg: np.asarray([float(cfg.layer_has_experts(layer))],
                                                                        np.float32))


def _first_name(layout: Any) -> str:
    return layout.pattern.format(expert=0) if isinstance(layout, PerExpert) else layout.name


def _read(layout: Any, lookup: TensorLookup, prefix: str, num_experts: int) -> Optional[np.ndarray]:
    """The stacked [E, in, out] from one layout, None when the checkpoint does not use it (its first tensor is
    absent); ValueError naming a later expert's tensor that is missing."""
    if isinstance(layout, Fused):
        fused = lookup(prefix + layout.name)
        if fused is None:
            return None
        if fused.shape[0] != num_experts:
            raise ValueError(f"tensor {prefix + layout.name!r}: {fused.shape[0]} experts, the config says "
                             f"{num_experts}")
        out_axis = 1 if layout.transposed else fused.ndim - 1
        width = fused.shape[out_axis] // layout.parts
        columns = (np.arange(layout.part, fused.shape[out_axis], layout.parts) if layout.interleaved
                   else np.arange(layout.part * width, (layout.part + 1) * width))
        part = fused.take(columns, axis=out_axis)  # an MXFP4 parameter dequantizes only these columns
        return np.ascontiguousarray(np.swapaxes(part, 1, 2) if layout.transposed else part)
    first = lookup(prefix + layout.pattern.format(expert=0))
    if first is None:
        return None
    stacked = np.empty((num_experts, first.shape[1], first.shape[0]), first.dtype)
    for expert in range(num_experts):
        name = prefix + layout.pattern.format(expert=expert)
        value = first if expert == 0 else lookup(name)
        if value is None:
            raise ValueError(f"tensor {name!r} is missing")
        if value.shape != first.shape:
            raise ValueError(f"tensor {name!r}: shape {value.shape}, expert 0's is {first.shape}")
        stacked[expert] = value.T
    return stacked
