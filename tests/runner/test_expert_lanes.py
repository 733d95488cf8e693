"""runner/expert_lanes.py: the TPU's expert stacks padded to whole 128-lane columns at load, as a zero-filled view that
places shard by shard, without changing what the MoE block computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.models.int8_weights import Int8Weight, quantize_int8, scale_name
from jaxpaged.models.moe import ExpertWeights, MoeRouting, moe_block
from jaxpaged.models.moe_decoder import MoeModelConfig, moe_fields
from jaxpaged.models.registry import read_model_config
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.expert_lanes import pad_experts_to_lanes
from jaxpaged.runner.zero_padded import ZeroPadded
from tests.conftest import TINY_LLAMA

LAYERS, EXPERTS, HIDDEN, WIDTH = 2, 4, 64, 16


def tiny_moe(expert_parallel: bool = False) -> MoeModelConfig:
    dense = read_model_config(dict(TINY_LLAMA, architectures=["LlamaForCausalLM"]))
    fields = moe_fields(dense)
    fields["hidden_size"] = HIDDEN
    return MoeModelConfig(**fields, num_experts=EXPERTS,
                          num_experts_per_tok=2, moe_intermediate_size=WIDTH, expert_parallel=expert_parallel)


def expert_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def f(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.3

    return {"layers.expert_gate": f(LAYERS, EXPERTS, HIDDEN, WIDTH),
            "layers.expert_up": f(LAYERS, EXPERTS, HIDDEN, WIDTH),
            "layers.expert_down": f(LAYERS, EXPERTS, WIDTH, HIDDEN),
            "layers.expert_gate_bias": f(LAYERS, EXPERTS, WIDTH),
            "layers.expert_up_bias": f(LAYERS, EXPERTS, WIDTH), "layers.expert_down_bias": f(LAYERS, EXPERTS, HIDDEN),
            "layers.router": f(LAYERS, HIDDEN, EXPERTS)}


def test_zero_padded_blocks_equal_np_pad():
    """Any block of slices (inside, straddling, wholly past the source; Ellipsis) equals np.pad's same block."""
    source = np.arange(3 * 5 * 7, dtype=np.float32).reshape(3, 5, 7)
    view = ZeroPadded(source, (3, 8, 12))
    expected = np.pad(source, ((0, 0), (0, 3), (0, 5)))
    for index in [(slice(None), slice(0, 4), slice(0, 6)), (slice(1, 3), slice(4, 8), slice(6, 12)),
                  (slice(None), slice(5, 8), slice(7, 12)), ..., (slice(0, 2),)]:
        np.testing.assert_array_equal(view[index], expected[index], err_msg=str(index))
    np.testing.assert_array_equal(np.asarray(view), expected)
    with pytest.raises(ValueError, match="must extend every axis"):
        ZeroPadded(source, (3, 4, 7))


@pytest.mark.parametrize("tp,expert_parallel,width", [(1, False, 128), (2, False, 256), (2, True, 128)])
def test_widths_are_padded_per_shard_and_hidden_whole(tp, expert_parallel, width):
    """Width 16 becomes whole lanes per width shard (256 when tp 2 splits it, 128 under expert parallelism), hidden
    64 becomes 128 in down's columns and scales only; the down bias, the router and a dense model are untouched."""
    params = expert_params()
    params[scale_name("layers.expert_down")] = np.ones((LAYERS, EXPERTS, HIDDEN), np.float32)
    padded = pad_experts_to_lanes(params, tiny_moe(expert_parallel), tp)
    assert padded["layers.expert_gate"].shape == (LAYERS, EXPERTS, HIDDEN, width)
    assert padded["layers.expert_up_bias"].shape == (LAYERS, EXPERTS, width)
    assert padded["layers.expert_down"].shape == (LAYERS, EXPERTS, width, 128)
    assert padded[scale_name("layers.expert_down")].shape == (LAYERS, EXPERTS, 128)
    assert padded["layers.expert_down_bias"] is params["layers.expert_down_bias"]
    assert padded["layers.router"] is params["layers.router"]
    dense = read_model_config(dict(TINY_LLAMA, architectures=["LlamaForCausalLM"]))
    assert pad_experts_to_lanes(params, dense, tp) is params


def test_placed_padded_experts_compute_what_unpadded_ones_do():
    """The padded stacks placed by place_params (shard by shard from the view) hold the source and zeros, and
    the MoE block over them (biases, float and int8) gives the unpadded block's output."""
    model = tiny_moe()
    params = expert_params(1)
    mesh = mesh_lib.rank_meshes(1, 1)[0]
    placed = mesh_lib.place_params(pad_experts_to_lanes(params, model, 1), model, mesh, jnp.float32)
    np.testing.assert_array_equal(np.asarray(placed["layers.expert_down"])[:, :, :WIDTH, :HIDDEN],
                                  params["layers.expert_down"])
    assert not np.asarray(placed["layers.expert_down"])[:, :, WIDTH:].any()
    routing = MoeRouting(EXPERTS, 2, "softmax_topk", True)
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((5, HIDDEN)).astype(np.float32))
    logits = jnp.asarray(rng.standard_normal((5, EXPERTS)).astype(np.float32))
    block = jax.jit(moe_block, static_argnums=(3,))

    def experts_of(stacks) -> ExpertWeights:
        return ExpertWeights(*(jnp.asarray(stacks[f"layers.expert_{name}"])[0] for name in
                               ("gate", "up", "down", "gate_bias", "up_bias", "down_bias")))

    expected = block(x, logits, experts_of(params), routing, jnp.int32(5))
    got = block(x, logits, experts_of(placed), routing, jnp.int32(5))
    assert got.shape == expected.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)
    int8_params: dict[str, np.ndarray] = {}
    for name in ("layers.expert_gate", "layers.expert_up", "layers.expert_down"):
        int8_params[name], int8_params[scale_name(name)] = quantize_int8(params[name])
    padded_int8 = {name: np.asarray(value) for name, value in pad_experts_to_lanes(int8_params, model, 1).items()}

    def int8_experts(stacks) -> ExpertWeights:
        gate, up, down = (Int8Weight(jnp.asarray(stacks[f"layers.expert_{name}"][0]),
                                     jnp.asarray(stacks[scale_name(f"layers.expert_{name}")][0]))
                          for name in ("gate", "up", "down"))
        return ExpertWeights(gate, up, down)

    np.testing.assert_allclose(np.asarray(block(x, logits, int8_experts(padded_int8), routing, jnp.int32(5))),
                               np.asarray(block(x, logits, int8_experts(int8_params), routing, jnp.int32(5))),
                               rtol=1e-5, atol=1e-5)
