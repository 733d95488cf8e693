"""Where a checkpoint keeps each of jaxpaged's parameters: names as data, one WeightNames per checkpoint format of a
family (models/families/), read by the loaders in weights/.

A checkpoint's tensor names first pass through the family's WeightsMapper, whose prefix rules rewrite another
naming scheme into the one `layer` and `globals` spell (vLLM's WeightsMapper has the same idea): a multimodal
wrapper that keeps the text model under `language_model.model.` is one rule, not another loader.
"""

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, Union

import numpy as np


@dataclasses.dataclass(frozen=True)
class CheckpointTensor:
    """One parameter's tensor in a checkpoint."""

    name: str
    """Its name: within a layer (after WeightNames.layer_prefix) for a layer weight, else the whole name."""
    transpose: bool = False
    """Stored [out, in] (torch's Linear.weight, GGUF's rows): jaxpaged's projections are [in, out]."""


@dataclasses.dataclass(frozen=True)
class WeightsMapper:
    """Prefix rewrites of a checkpoint's tensor names, tried in order: the first rule whose prefix starts a name
    replaces that prefix (a None replacement drops the tensor: a vision tower the text model never reads)."""

    orig_to_new_prefix: tuple[tuple[str, Optional[str]], ...] = ()

    def map_name(self, name: str) -> Optional[str]:
        """`name` rewritten by the first matching rule; unchanged when none matches; None when it is dropped."""
        for prefix, replacement in self.orig_to_new_prefix:
            if name.startswith(prefix):
                return None if replacement is None else replacement + name[len(prefix):]
        return name

    def map_names(self, names: Iterable[str]) -> dict[str, str]:
        """{rewritten name: checkpoint name} of every tensor kept; ValueError when two map to one name."""
        mapped: dict[str, str] = {}
        for name in names:
            new = self.map_name(name)
            if new is None:
                continue
            if new in mapped:
                raise ValueError(f"checkpoint tensors {mapped[new]!r} and {name!r} both map to {new!r}")
            mapped[new] = name
        return mapped


@dataclasses.dataclass(frozen=True)
class WeightNames:
    """How one checkpoint format names a family's parameters (jaxpaged's flat names without "layers.")."""

    layer: Mapping[str, "Union[CheckpointTensor, AssembledTensor]"]
    """Each layer weight ("q_proj") -> its tensor inside a layer (or how it is assembled from several)."""
    globals: Mapping[str, CheckpointTensor]
    """Each global weight ("embed", "final_norm", "lm_head") -> its tensor."""
    layer_prefix: str = "model.layers.{layer}."
    """What precedes a layer tensor's name; {layer} is the layer index."""
    mapper: WeightsMapper = WeightsMapper()
    """Rewrites the checkpoint's names into the ones above before any is looked up."""

    def tensor(self, name: str, layer: Optional[int]) -> CheckpointTensor:
        """The checkpoint tensor of parameter `name` in `layer` (None: a global weight), under its full name."""
        if layer is None:
            return self.globals[name]
        inner = self.layer[name]
        assert isinstance(inner, CheckpointTensor), f"{name} is assembled from several tensors"
        return dataclasses.replace(inner, name=self.layer_prefix.format(layer=layer) + inner.name)

    def with_layer(self, **changes: "Union[CheckpointTensor, AssembledTensor]") -> "WeightNames":
        """These names with some layer weights named otherwise or added."""
        return dataclasses.replace(self, layer={**self.layer, **changes})


TensorLookup = Callable[[str], Optional[np.ndarray]]
"""A checkpoint's tensor by its full name (as stored: no transpose), or None when the checkpoint has none."""


@dataclasses.dataclass(frozen=True)
class AssembledTensor:
    """A layer parameter a family builds from several checkpoint tensors (a mixture of experts' stacked experts,
    from per-expert or fused tensors: models/expert_tensors.py), read by the HF loader through `build`."""

    build: Callable[[TensorLookup, str, int, Any], np.ndarray]
    """(lookup, the layer's name prefix, the layer index, the ModelConfig) -> the layer's parameter in jaxpaged's
    orientation; ValueError naming the tensor it misses."""
