"""models/moe.py against a hand-written dense reference: every expert computed for every token, weighted by its
top-k weight (zero for experts not chosen)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.models.int8_weights import Int8Weight, dequantize_int8, quantize_int8
from jaxpaged.models.moe import (
    ExpertWeights,
    MoeRouting,
    expert_matmul,
    expert_matmul_name,
    route,
    router_logits,
    silu_gated,
)
from jaxpaged.models.moe import moe_block as eager_moe_block

moe_block = jax.jit(eager_moe_block, static_argnums=(3,), static_argnames=("activation",))
"""One compile per test rather than one per operation."""

HIDDEN, INNER, EXPERTS = 8, 6, 5


def dense_reference(x, logits, experts: ExpertWeights, routing: MoeRouting) -> np.ndarray:
    """Float64 numpy: the top-k chosen and weighted by hand, every expert run on every token."""
    x, logits = np.asarray(x, np.float64), np.asarray(logits, np.float64)
    tokens = x.shape[0]
    dense_weight = np.zeros((tokens, routing.num_experts))
    for t in range(tokens):
        order = np.argsort(-logits[t], kind="stable")[:routing.top_k]
        if routing.style == "softmax_topk":
            probs = np.exp(logits[t] - logits[t].max())
            probs /= probs.sum()
            chosen = probs[order]
            if routing.renormalize:
                chosen = chosen / chosen.sum()
        else:
            chosen = np.exp(logits[t][order] - logits[t][order].max())
            chosen /= chosen.sum()
        dense_weight[t, order] = chosen
    out = np.zeros_like(x)
    for e in range(routing.num_experts):
        gate = x @ np.asarray(experts.gate[e], np.float64)
        up = x @ np.asarray(experts.up[e], np.float64)
        if experts.gate_bias is not None and experts.up_bias is not None:
            gate, up = gate + np.asarray(experts.gate_bias[e]), up + np.asarray(experts.up_bias[e])
        hidden = gate / (1 + np.exp(-gate)) * up
        y = hidden @ np.asarray(experts.down[e], np.float64)
        if experts.down_bias is not None:
            y = y + np.asarray(experts.down_bias[e])
        out += dense_weight[:, e:e + 1] * y
    return out


def random_experts(seed: int, biases: bool = False) -> ExpertWeights:
    rng = np.random.default_rng(seed)

    def f(*shape):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 0.5)

    return ExpertWeights(f(EXPERTS, HIDDEN, INNER), f(EXPERTS, HIDDEN, INNER), f(EXPERTS, INNER, HIDDEN),
                         *((f(EXPERTS, INNER), f(EXPERTS, INNER), f(EXPERTS, HIDDEN)) if biases else ()))


def logits_for(choices: list[list[int]]) -> np.ndarray:
    """Router logits that make token t choose choices[t] in that order (distinct, decreasing values)."""
    logits = np.full((len(choices), EXPERTS), -4.0, np.float32)
    for t, chosen in enumerate(choices):
        for rank, expert in enumerate(chosen):
            logits[t, expert] = 2.0 - 0.7 * rank + 0.1 * t
    return logits


@pytest.mark.parametrize("style,renormalize", [("softmax_topk", True), ("softmax_topk", False),
                                               ("topk_softmax", False)])
def test_ragged_groups_and_empty_experts_match_dense_reference(style, renormalize):
    """Group sizes 3, 0, 4, 0, 1 (experts 1 and 3 chosen by nobody) match the dense reference in every routing
    style."""
    choices = [[0, 2], [2, 0], [4, 2], [2, 0]]  # expert 0: 3 rows, 2: 4 rows, 4: 1 row; 1 and 3 empty
    routing = MoeRouting(EXPERTS, 2, style, renormalize)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, HIDDEN)).astype(np.float32))
    experts = random_experts(1)
    logits = jnp.asarray(logits_for(choices))
    got = moe_block(x, logits, experts, routing, jnp.int32(4))
    np.testing.assert_allclose(np.asarray(got), dense_reference(x, logits, experts, routing), rtol=1e-5, atol=1e-5)


def test_expert_biases_and_router_bias():
    """Per-expert gate/up/down biases are added to each expert's rows; a router bias shifts the logits."""
    routing = MoeRouting(EXPERTS, 3, "topk_softmax")
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((7, HIDDEN)).astype(np.float32))
    router = jnp.asarray(rng.standard_normal((HIDDEN, EXPERTS)).astype(np.float32))
    bias = jnp.asarray(np.array([0, 0, 5, 0, -5], np.float32))
    logits = router_logits(x, router, bias)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(x) @ np.asarray(router) + np.asarray(bias), rtol=1e-5)
    experts = random_experts(3, biases=True)
    got = moe_block(x, logits, experts, routing, jnp.int32(7))
    np.testing.assert_allclose(np.asarray(got), dense_reference(x, logits, experts, routing), rtol=1e-5, atol=1e-5)


def test_padding_rows_do_no_work_and_leave_real_rows_alone():
    """Rows past num_rows are routed nowhere (zero output), and the real rows equal a batch without them."""
    routing = MoeRouting(EXPERTS, 2, "softmax_topk", True)
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((6, HIDDEN)).astype(np.float32))
    logits = jnp.asarray(rng.standard_normal((6, EXPERTS)).astype(np.float32))
    experts = random_experts(5)
    got = np.asarray(moe_block(x, logits, experts, routing, jnp.int32(4)))
    np.testing.assert_array_equal(got[4:], 0.0)
    np.testing.assert_allclose(got[:4], dense_reference(x[:4], logits[:4], experts, routing), rtol=1e-5, atol=1e-5)


def test_every_token_to_one_expert():
    """Top-1 routing of every token to expert 3: one group holds every row, the others are empty."""
    routing = MoeRouting(EXPERTS, 1, "softmax_topk", True)
    x = jnp.asarray(np.random.default_rng(6).standard_normal((9, HIDDEN)).astype(np.float32))
    logits = jnp.asarray(logits_for([[3]] * 9))
    experts = random_experts(7)
    got = moe_block(x, logits, experts, routing, jnp.int32(9))
    np.testing.assert_allclose(np.asarray(got), dense_reference(x, logits, experts, routing), rtol=1e-5, atol=1e-5)


def test_route_weights_float32_and_renormalised():
    """Softmax-then-top-k weights sum to 1 when renormalised and to the chosen probabilities otherwise."""
    logits = jnp.asarray(np.array([[1.0, 3.0, 2.0, 0.0, -1.0]], np.float32))
    probs = np.exp([1.0, 3.0, 2.0, 0.0, -1.0])
    probs /= probs.sum()
    weights, ids = route(logits, MoeRouting(EXPERTS, 2))
    assert weights.dtype == jnp.float32 and ids.tolist() == [[1, 2]]
    np.testing.assert_allclose(np.asarray(weights)[0], probs[[1, 2]], rtol=1e-6)
    weights, _ = route(logits, MoeRouting(EXPERTS, 2, renormalize=True))
    np.testing.assert_allclose(np.asarray(weights)[0], probs[[1, 2]] / probs[[1, 2]].sum(), rtol=1e-6)


def test_expert_matmul_int8_scales_and_padding_rows():
    """int8 rhs with per-group column scales equals ragged_dot of the dequantized weights; rows past
    sum(group_sizes) are zero; an empty group is skipped."""
    rng = np.random.default_rng(8)
    lhs = jnp.asarray(rng.standard_normal((10, HIDDEN)).astype(np.float32))
    values, scale = quantize_int8(rng.standard_normal((4, HIDDEN, INNER)).astype(np.float32))
    sizes = jnp.asarray([3, 0, 4, 1], jnp.int32)
    got = np.asarray(expert_matmul(lhs, jnp.asarray(values), sizes, jnp.asarray(scale)))
    expected = np.asarray(jax.lax.ragged_dot(lhs, jnp.asarray(dequantize_int8(values, scale)), sizes))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[8:], 0.0)


@pytest.mark.parametrize("platform,kernel_marker,absent", [
    ("cuda", "xla.gpu.triton", "ragged_dot"),
    ("tpu", "tpu_custom_call", "ragged_dot"),
])
def test_expert_matmul_lowers_to_the_platforms_grouped_kernel(platform, kernel_marker, absent):
    """Lowered for a GPU (cuda) expert_matmul is the Pallas Triton grouped matmul, for a TPU the Mosaic one: one
    kernel call each, and no ragged_dot (which XLA:GPU, like XLA:CPU, expands into a dense dot over every expert)."""
    args = (jax.ShapeDtypeStruct((64, 32), jnp.bfloat16), jax.ShapeDtypeStruct((4, 32, 48), jnp.int8),
            jax.ShapeDtypeStruct((4,), jnp.int32), jax.ShapeDtypeStruct((4, 48), jnp.float32))
    text = jax.jit(expert_matmul).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    assert text.count(kernel_marker) == 1 and absent not in text


def test_expert_matmul_name_per_platform():
    """The start-up plan names the grouped matmul each platform runs: Pallas Triton on a GPU (jax.Device.platform
    "gpu", or a lowering platform's "cuda" / "rocm"), Pallas TPU on a TPU, ragged_dot elsewhere."""
    for gpu in ("gpu", "cuda", "rocm"):
        assert expert_matmul_name(gpu, jnp.bfloat16) == expert_matmul_name(gpu, jnp.int8) == (
            "Pallas Triton grouped matmul")
    assert expert_matmul_name("tpu", jnp.bfloat16) == "Pallas TPU grouped matmul"
    assert expert_matmul_name("metal", jnp.float32) == "jax.lax.ragged_dot"


def test_int8_experts_match_their_dequantized_floats():
    """moe_block over Int8Weight experts equals the dense reference over the dequantized weights."""
    routing = MoeRouting(EXPERTS, 2, "softmax_topk", True)
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.standard_normal((5, HIDDEN)).astype(np.float32))
    logits = jnp.asarray(rng.standard_normal((5, EXPERTS)).astype(np.float32))
    floats = random_experts(10)
    quantized = [quantize_int8(np.asarray(w)) for w in floats[:3]]
    as_int8 = [Int8Weight(jnp.asarray(v), jnp.asarray(s)) for v, s in quantized]
    int8_experts = ExpertWeights(as_int8[0], as_int8[1], as_int8[2])
    as_float = [jnp.asarray(dequantize_int8(v, s)) for v, s in quantized]
    dequantized = ExpertWeights(as_float[0], as_float[1], as_float[2])
    got = moe_block(x, logits, int8_experts, routing, jnp.int32(5), activation=silu_gated)
    np.testing.assert_allclose(np.asarray(got), dense_reference(x, logits, dequantized, routing), rtol=1e-4,
                               atol=1e-4)


def test_bad_routing_names_the_field():
    """An unknown routing style or a top-k above the expert count is a ValueError naming it."""
    with pytest.raises(ValueError, match="routing style"):
        MoeRouting(EXPERTS, 2, "sigmoid")
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        MoeRouting(EXPERTS, 6)
