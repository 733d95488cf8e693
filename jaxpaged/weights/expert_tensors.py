"""Reading a mixture of experts' weights from a checkpoint in any layout models/expert_layouts.py names, into
jaxpaged's [num_experts, in, out] (gate and up fused with the gate half first)."""

from collections.abc import Callable
from typing import Optional, Union

import numpy as np

from jaxpaged.models.expert_layouts import EXPERT, ExpertLayouts, FusedExpertTensor, PerExpertTensors
from jaxpaged.models.weight_names import CheckpointTensor
from jaxpaged.weights.mxfp4 import BLOCKS_SUFFIX, SCALES_SUFFIX, dequantize_mxfp4
from jaxpaged.weights.safetensors_file import TensorEntry, open_tensor

ExpertTensor = Union[PerExpertTensors, FusedExpertTensor, ExpertLayouts, CheckpointTensor]
"""The checkpoint tensors this module reads (a plain one only as an alternative of ExpertLayouts)."""

Find = Callable[[str], Optional[TensorEntry]]
"""find(name): the checkpoint's tensor of that name (after the family's WeightsMapper), None when it has none."""


class MissingTensor(ValueError):
    """A tensor a layout needs is not in the checkpoint; its name is `name`."""

    def __init__(self, name: str, detail: str = ""):
        super().__init__(f"tensor {name!r} is missing{detail}")
        self.name = name


def is_expert_tensor(tensor: object) -> bool:
    """Whether `tensor` (a family's CheckpointTensor) is one of the layouts this module reads."""
    return isinstance(tensor, (PerExpertTensors, FusedExpertTensor, ExpertLayouts))


def read_expert_tensor(tensor: ExpertTensor, find: Find, num_experts: int) -> np.ndarray:
    """The parameter `tensor` names, [num_experts, ...] in the checkpoint's float dtype (MXFP4: bfloat16).
    MissingTensor naming the first tensor absent (for alternatives: the first layout's, listing the others)."""
    if isinstance(tensor, ExpertLayouts):
        return _read_first_layout(tensor, find, num_experts)
    if isinstance(tensor, PerExpertTensors):
        return _read_per_expert(tensor, find, num_experts)
    if isinstance(tensor, FusedExpertTensor):
        return _read_fused(tensor, find)
    value = _open(find, tensor.name)  # a plain tensor among alternatives (a router under either layout's name)
    return value.T if tensor.transpose else value


def _read_first_layout(tensor: ExpertLayouts, find: Find, num_experts: int) -> np.ndarray:
    first_missing: Optional[MissingTensor] = None
    for layout in tensor.layouts:
        try:
            return read_expert_tensor(layout, find, num_experts)
        except MissingTensor as missing:
            if first_missing is None:
                first_missing = missing
            # NOTE: a layout whose first tensor is there but a later one is not is a broken checkpoint of that
            # layout: its missing tensor is the one to name, not the first alternative's.
            if _has_any(layout, find):
                raise
    assert first_missing is not None
    others = ", ".join(repr(layout.name.replace(EXPERT, "N")) for layout in tensor.layouts[1:])
    raise MissingTensor(first_missing.name, f" (nor is any other layout of it there: {others})" if others else "")


def _has_any(layout: CheckpointTensor, find: Find) -> bool:
    """Whether the checkpoint holds the first tensor of `layout` (expert 0's, for per-expert ones)."""
    name = layout.name.replace(EXPERT, "0")
    if isinstance(layout, FusedExpertTensor) and layout.mxfp4:
        return find(name) is not None or find(name + BLOCKS_SUFFIX) is not None
    return find(name) is not None


def _open(find: Find, name: str) -> np.ndarray:
    entry = find(name)
    if entry is None:
        raise MissingTensor(name)
    return open_tensor(entry)


def _read_per_expert(tensor: PerExpertTensors, find: Find, num_experts: int) -> np.ndarray:
    """Each expert's tensors (transposed to [in, out] when stored [out, in]) concatenated, stacked over experts."""
    stacked: Optional[np.ndarray] = None
    for expert in range(num_experts):
        parts = [_open(find, name.replace(EXPERT, str(expert))) for name in (tensor.name, *tensor.also)]
        parts = [part.T if tensor.transpose else part for part in parts]
        if stacked is None:
            width = sum(part.shape[-1] for part in parts)
            stacked = np.empty((num_experts, *parts[0].shape[:-1], width), dtype=parts[0].dtype)
        start = 0
        for part in parts:
            stacked[expert, ..., start:start + part.shape[-1]] = part
            start += part.shape[-1]
    if stacked is None:
        raise ValueError(f"tensor {tensor.name!r}: a mixture of experts needs at least one expert")
    return stacked


def _read_fused(tensor: FusedExpertTensor, find: Find) -> np.ndarray:
    """The whole tensor (or its MXFP4 blocks and scales, dequantized), as [E, in, out] with the gate half first."""
    entry = find(tensor.name)
    if entry is not None:
        value = open_tensor(entry)
        stored_out_in = tensor.transpose
    elif tensor.mxfp4 and find(tensor.name + BLOCKS_SUFFIX) is not None:
        blocks, scales = (_open_packed(find, tensor.name + suffix) for suffix in (BLOCKS_SUFFIX, SCALES_SUFFIX))
        value = dequantize_mxfp4(blocks, scales, name=tensor.name)
        stored_out_in = True  # MXFP4 groups run along the input axis: the packed form is always [E, out, in]
    else:
        raise MissingTensor(tensor.name)
    if stored_out_in:
        value = np.swapaxes(value, -1, -2)
    if tensor.interleaved:
        value = np.concatenate([value[..., 0::2], value[..., 1::2]], axis=-1)
    return value


def _open_packed(find: Find, name: str) -> np.ndarray:
    entry = find(name)
    if entry is None:
        raise MissingTensor(name)
    if entry.dtype != "U8":
        raise ValueError(f"tensor {name!r}: MXFP4 blocks and scales are U8, got {entry.dtype}")
    return open_tensor(entry, quantized=True)
