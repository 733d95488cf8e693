"""How checkpoints lay out a mixture of experts' weights: names as data, beside weight_names.py's CheckpointTensor,
read by weights/expert_tensors.py. Each one yields a parameter in jaxpaged's layout: experts stacked on a leading
axis, [num_experts, in, out], gate and up fused as [num_experts, hidden, 2 * intermediate] with the gate half first.

Checkpoints ship three layouts: one tensor per expert (Mixtral's `block_sparse_moe.experts.N.w1.weight`), one fused
3-D tensor per layer (transformers 5's `mlp.experts.gate_up_proj`, gpt-oss's with gate and up interleaved), and
gpt-oss's fused tensors in MXFP4 (`_blocks` and `_scales`, weights/mxfp4.py). A family names the layouts it accepts
as alternatives (ExpertLayouts); the loader takes the first one the checkpoint holds.
"""

import dataclasses

from jaxpaged.models.weight_names import CheckpointTensor

EXPERT = "{expert}"
"""Stands for the expert index in a per-expert tensor's name."""


@dataclasses.dataclass(frozen=True)
class PerExpertTensors(CheckpointTensor):
    """A parameter stacked from one tensor per expert (`name` holds {expert}); `also` names more tensors of each
    expert concatenated after it on the output axis (Mixtral's w3, the up projection beside w1's gate)."""

    also: tuple[str, ...] = ()

    def under(self, prefix: str) -> "PerExpertTensors":
        """These names behind `prefix`."""
        return dataclasses.replace(self, name=prefix + self.name, also=tuple(prefix + name for name in self.also))


@dataclasses.dataclass(frozen=True)
class FusedExpertTensor(CheckpointTensor):
    """A parameter stored whole, experts on its leading axis: [E, in, out], or [E, out, in] when `transpose`.

    `interleaved`: its last axis alternates gate and up columns (gpt-oss), reordered to the gate half first.
    `mxfp4`: it may be stored as `name_blocks` / `name_scales` MXFP4 tensors of its [E, out, in] form (gpt-oss's
    released checkpoints), dequantized as it loads.
    """

    interleaved: bool = False
    mxfp4: bool = False


@dataclasses.dataclass(frozen=True)
class ExpertLayouts(CheckpointTensor):
    """One parameter any of several layouts may hold: the first whose tensors the checkpoint has is read. `name` is
    the first layout's, which an error about a missing tensor names."""

    layouts: tuple[CheckpointTensor, ...] = ()

    def under(self, prefix: str) -> "ExpertLayouts":
        """Every layout behind `prefix`."""
        layouts = tuple(layout.under(prefix) for layout in self.layouts)
        return dataclasses.replace(self, name=layouts[0].name, layouts=layouts)


def one_of(*layouts: CheckpointTensor) -> ExpertLayouts:
    """The parameter held by whichever of `layouts` the checkpoint has (the first wins)."""
    return ExpertLayouts(layouts[0].name, layouts=tuple(layouts))
