"""Stacked experts [E, in, out] from each checkpoint layout (models/expert_tensors.py), by hand-built tensors."""

import dataclasses

import numpy as np
import pytest

from jaxpaged.models.expert_tensors import Fused, PerExpert, expert_stack

E, HIDDEN, INNER = 3, 4, 2
PREFIX = "model.layers.0."


@dataclasses.dataclass
class _Config:
    num_experts: int = E
    expert_layers: tuple = ()

    def layer_has_experts(self, layer: int) -> bool:
        return not self.expert_layers or self.expert_layers[layer]

    def layer_shapes(self) -> dict:
        return {"expert_gate": (E, HIDDEN, INNER)}


def _build(param, tensors: dict, config=None) -> np.ndarray:
    return param.build(tensors.get, PREFIX, 0, config or _Config())


def _weights() -> np.ndarray:
    """Each expert's [in, out] gate and up, values unique so any mix-up shows."""
    return np.arange(2 * E * HIDDEN * INNER, dtype=np.float32).reshape(2, E, HIDDEN, INNER)


def test_per_expert_tensors_are_transposed_and_stacked():
    """torch's [out, in] per expert becomes [E, in, out] in expert order."""
    gate = _weights()[0]
    tensors = {f"{PREFIX}mlp.experts.{e}.gate_proj.weight": gate[e].T.copy() for e in range(E)}
    param = expert_stack("expert_gate", PerExpert("mlp.experts.{expert}.gate_proj.weight"))
    np.testing.assert_array_equal(_build(param, tensors), gate)


def test_fused_halves_and_interleaved_columns():
    """Qwen3-MoE's [E, 2I, H] (gate rows first) and gpt-oss's [E, H, 2I] (gate and up columns alternating) give the
    same gate and up stacks."""
    gate, up = _weights()
    halves = {PREFIX + "mlp.experts.gate_up_proj": np.concatenate([gate, up], axis=2).transpose(0, 2, 1).copy()}
    interleaved = np.empty((E, HIDDEN, 2 * INNER), np.float32)
    interleaved[..., 0::2], interleaved[..., 1::2] = gate, up
    for part, expected in ((0, gate), (1, up)):
        from_halves = expert_stack("expert_gate", Fused("mlp.experts.gate_up_proj", part=part, parts=2))
        np.testing.assert_array_equal(_build(from_halves, halves), expected)
        from_interleaved = expert_stack("expert_gate", Fused("mlp.experts.gate_up_proj", part=part, parts=2,
                                                             transposed=False, interleaved=True))
        np.testing.assert_array_equal(_build(from_interleaved, {PREFIX + "mlp.experts.gate_up_proj": interleaved}),
                                      expected)


def test_missing_expert_and_unknown_layout_name_the_tensor():
    """A missing expert's tensor, and a layer with no known layout, are errors naming the tensor."""
    param = expert_stack("expert_gate", PerExpert("mlp.experts.{expert}.gate_proj.weight"),
                         Fused("mlp.experts.gate_up_proj", parts=2))
    some = {f"{PREFIX}mlp.experts.{e}.gate_proj.weight": np.zeros((INNER, HIDDEN), np.float32) for e in (0, 2)}
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.experts\.1\.gate_proj\.weight' is missing"):
        _build(param, some)
    with pytest.raises(ValueError, match=r"experts\.0\.gate_proj\.weight' or 'model\.layers\.0\.mlp\.experts\."
                                         r"gate_up_proj' is missing"):
        _build(param, {})


def test_a_dense_layer_holds_zeros():
    """A layer without experts (kinds mixed) gets zeros of the parameter's shape and reads nothing."""
    param = expert_stack("expert_gate", PerExpert("mlp.experts.{expert}.gate_proj.weight"))
    zeros = _build(param, {}, _Config(expert_layers=(False,)))
    assert zeros.shape == (E, HIDDEN, INNER) and not zeros.any()
