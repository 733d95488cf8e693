"""Mixture-of-experts MLP block: router -> top-k -> tokens sorted by expert -> grouped matmuls -> weighted combine.

Dropless (vLLM's and HF's semantics): every token reaches each of its top-k experts; group sizes are exact counts,
no capacity factor. The (token, expert) assignments are sorted by expert so each expert's rows are contiguous, and
every expert matmul goes through `expert_matmul` (the grouped-matmul contract: jax.lax.ragged_dot semantics), which
is the one place a platform's grouped kernel is chosen (gate and up through `expert_matmul_pair`: on the CPU one
native call for both, elsewhere expert_matmul twice). Assignments that are not this block's to compute (padding
rows past num_rows; under expert parallelism, experts another shard holds) are given the sentinel group past the
last expert, so they sort after sum(group_sizes): the grouped matmul does no work for them and their weight is 0.

Expert weights are stored [num_experts, in, out] (gate and up [E, hidden, intermediate], down [E, intermediate,
hidden]); int8 experts are Int8Weight(values [E, in, out], float32 scales [E, out]). On TPU the intermediate and
down's hidden columns are zero-padded to whole 128 lanes at load (runner/expert_lanes.py): down's extra output
columns are dropped here.

Under a mesh with tp > 1 the block runs per model shard in shard_map (`run_sharded`): with expert parallelism each
shard holds E / tp whole experts and computes only their assignments; without it each shard holds every expert's
1/tp slice of the intermediate axis (as the dense MLP is split). Tokens are replicated; one psum combines.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float, Float32, Int, Int32

from jaxpaged.kernels.cpu_native.grouped_matmul import (
    grouped_matmul_available,
    grouped_matmul_cpu,
    grouped_matmuls_cpu,
)
from jaxpaged.models.int8_weights import Int8Weight
from pallas_kernels.grouped_matmul import grouped_matmul as tpu_grouped_matmul
from pallas_kernels.grouped_matmul import grouped_matmul_gpu as gpu_grouped_matmul

ExpertWeight = Union[Float[Array, "experts inner outer"], Int8Weight]
"""One expert projection of every expert: float [E, in, out], or int8 values [E, in, out] with scales [E, out]."""

GPU_PLATFORMS = ("gpu", "cuda", "rocm")
"""What a GPU is called: jax.Device.platform says "gpu", lowering platforms say "cuda" or "rocm"."""

ROUTING_STYLES = ("softmax_topk", "topk_softmax")
"""softmax_topk: softmax over every expert, then the top k (Qwen-MoE, Mixtral; renormalised per `renormalize`);
topk_softmax: the top k logits, then a softmax over those k (gpt-oss)."""


class ExpertWeights(NamedTuple):
    """One MoE layer's experts; the biases are optional (gpt-oss has them, Qwen3-MoE and Mixtral do not)."""

    gate: ExpertWeight
    """[E, hidden, intermediate]"""
    up: ExpertWeight
    """[E, hidden, intermediate]"""
    down: ExpertWeight
    """[E, intermediate, hidden]"""
    gate_bias: Optional[Float[Array, "experts intermediate"]] = None
    up_bias: Optional[Float[Array, "experts intermediate"]] = None
    down_bias: Optional[Float[Array, "experts hidden"]] = None


@dataclasses.dataclass(frozen=True)
class MoeRouting:
    """How a family turns router logits into top-k expert ids and weights."""

    num_experts: int
    top_k: int
    style: str = "softmax_topk"
    """One of ROUTING_STYLES."""
    renormalize: bool = False
    """softmax_topk only: divide the k weights by their sum (HF's norm_topk_prob; Mixtral always does)."""

    def __post_init__(self):
        if self.style not in ROUTING_STYLES:
            raise ValueError(f"routing style: {self.style!r} is not one of {ROUTING_STYLES}")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok: {self.top_k} must be in [1, num_experts={self.num_experts}]")


def silu_gated(gate: Float[Array, "rows inner"], up: Float[Array, "rows inner"]) -> Float[Array, "rows inner"]:
    """SiLU(gate) * up: the gated MLP's activation (Qwen-MoE, Mixtral)."""
    return jax.nn.silu(gate) * up


Activation = Callable[[jax.Array, jax.Array], jax.Array]
"""(gate, up) -> the down projection's input; gpt-oss passes its clamped SwiGLU."""


def expert_matmul_name(platform: str, dtype: Any) -> str:
    """What expert_matmul runs on `platform` for experts stored in `dtype`, for the start-up plan's line."""
    if platform == "cpu" and grouped_matmul_available(dtype):
        return "native CPU grouped matmul"
    if platform == "tpu":
        return "Pallas TPU grouped matmul"
    if platform in GPU_PLATFORMS:
        return "Pallas Triton grouped matmul"
    return "jax.lax.ragged_dot"


def expert_matmul(lhs: Float[Array, "m k"], rhs: Union[Float[Array, "g k n"], Int[Array, "g k n"]],
                  group_sizes: Int32[Array, " g"], rhs_scale: Optional[Float32[Array, "g n"]] = None,
                  ) -> Float[Array, "m n"]:
    """Grouped matmul (the contract shared with pallas_kernels/grouped_matmul and the native CPU kernel): rows
    [start_i, start_i + group_sizes[i]) of `lhs` times rhs[i]; rows at or past sum(group_sizes) come out zero;
    float32 accumulation, lhs's dtype out; `rhs_scale` multiplies group i's output column j (int8 rhs).

    On the CPU the native grouped matmul (kernels/cpu_native/grouped_matmul), which reads only the non-empty groups'
    weights, where it is built for rhs's dtype; on TPU the Pallas grouped matmul (pallas_kernels/grouped_matmul: each
    touched expert's weights fetched once, empty experts never, int8 with scales); on a GPU the Pallas Triton grouped
    matmul (grouped_matmul_gpu: the same reads); elsewhere (a CPU without the native build) jax.lax.ragged_dot.
    XLA:CPU and XLA:GPU both rewrite ragged_dot into a dense dot over every expert (XLA's RaggedDotRewriter; its
    cuDNN grouped GEMM takes only bf16/f16 outputs behind an experimental flag, and our outputs are float32), so it
    is the reference, not a path (docs/features.md, "The grouped matmul on each platform")."""
    # NOTE: only a CPU host builds the native library (a TPU or GPU host would compile C++ it never runs).
    native = jax.default_backend() == "cpu" and grouped_matmul_available(rhs.dtype)
    cpu = grouped_matmul_cpu if native else _ragged_dot_matmul
    return jax.lax.platform_dependent(lhs, rhs, group_sizes, rhs_scale, cpu=cpu, tpu=_pallas_tpu_matmul,
                                      cuda=_pallas_triton_matmul, rocm=_pallas_triton_matmul,
                                      default=_ragged_dot_matmul)


def expert_matmul_pair(lhs: Float[Array, "m k"], first: Union[Float[Array, "g k n"], Int[Array, "g k n"]],
                       second: Union[Float[Array, "g k n"], Int[Array, "g k n"]], group_sizes: Int32[Array, " g"],
                       first_scale: Optional[Float32[Array, "g n"]] = None,
                       second_scale: Optional[Float32[Array, "g n"]] = None,
                       ) -> tuple[Float[Array, "m n"], Float[Array, "m n"]]:
    """expert_matmul of the same rows by two weights (gate and up): on the CPU's native kernel one call for both
    (one hand-out of work to the threads, not two: at a decode step each call is a fraction of a millisecond, and a
    call waits for its slowest thread), elsewhere two expert_matmul calls."""
    def one_call(lhs, first, second, group_sizes, first_scale, second_scale):
        scales = None if first_scale is None else (first_scale, second_scale)
        return grouped_matmuls_cpu(lhs, (first, second), group_sizes, scales)

    def two_calls(lhs, first, second, group_sizes, first_scale, second_scale):
        return (expert_matmul(lhs, first, group_sizes, first_scale),
                expert_matmul(lhs, second, group_sizes, second_scale))

    native = (jax.default_backend() == "cpu" and first.dtype == second.dtype and grouped_matmul_available(first.dtype)
              and (first_scale is None) == (second_scale is None))
    if not native:
        return two_calls(lhs, first, second, group_sizes, first_scale, second_scale)
    gate, up = jax.lax.platform_dependent(lhs, first, second, group_sizes, first_scale, second_scale, cpu=one_call,
                                          default=two_calls)
    return gate, up


def _pallas_tpu_matmul(lhs: Float[Array, "m k"], rhs: Union[Float[Array, "g k n"], Int[Array, "g k n"]],
                       group_sizes: Int32[Array, " g"], rhs_scale: Optional[Float32[Array, "g n"]] = None,
                       ) -> Float[Array, "m n"]:
    """expert_matmul by the Pallas (Mosaic) grouped matmul on TPU."""
    return tpu_grouped_matmul(lhs, rhs, group_sizes, rhs_scale)


def _pallas_triton_matmul(lhs: Float[Array, "m k"], rhs: Union[Float[Array, "g k n"], Int[Array, "g k n"]],
                          group_sizes: Int32[Array, " g"], rhs_scale: Optional[Float32[Array, "g n"]] = None,
                          ) -> Float[Array, "m n"]:
    """expert_matmul by the Pallas Triton grouped matmul on a GPU (its tiles chosen from the batch's rows)."""
    return gpu_grouped_matmul(lhs, rhs, group_sizes, rhs_scale)


def _ragged_dot_matmul(lhs: Float[Array, "m k"], rhs: Union[Float[Array, "g k n"], Int[Array, "g k n"]],
                       group_sizes: Int32[Array, " g"], rhs_scale: Optional[Float32[Array, "g n"]] = None,
                       ) -> Float[Array, "m n"]:
    """expert_matmul by jax.lax.ragged_dot: the reference semantics; the path of a CPU without the native build."""
    weight = rhs if rhs_scale is None else rhs.astype(lhs.dtype)
    out = jax.lax.ragged_dot(lhs, weight, group_sizes, preferred_element_type=jnp.float32)
    if rhs_scale is not None:
        out = out * rhs_scale[_row_groups(group_sizes, lhs.shape[0])]
    return out.astype(lhs.dtype)


def _row_groups(group_sizes: Int32[Array, " g"], num_rows: int) -> Int32[Array, " m"]:
    """Each row's group (rows past sum(group_sizes) get the last group; their output is zero anyway)."""
    ends = jnp.cumsum(group_sizes)
    group = jnp.searchsorted(ends, jnp.arange(num_rows, dtype=ends.dtype), side="right")
    return jnp.minimum(group, group_sizes.shape[0] - 1)


def route(router_logits: Float32[Array, "tokens experts"], routing: MoeRouting,
          ) -> tuple[Float32[Array, "tokens k"], Int32[Array, "tokens k"]]:
    """(top-k weights in float32, top-k expert ids) of each token, as the family's routing style says."""
    logits = router_logits.astype(jnp.float32)
    if routing.style == "topk_softmax":
        top_logits, ids = jax.lax.top_k(logits, routing.top_k)
        return jax.nn.softmax(top_logits, axis=-1), ids.astype(jnp.int32)
    weights, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), routing.top_k)
    if routing.renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, ids.astype(jnp.int32)


def router_logits(x: Float[Array, "tokens hidden"], router: Float[Array, "hidden experts"],
                  router_bias: Optional[Float[Array, " experts"]] = None) -> Float32[Array, "tokens experts"]:
    """x @ router (+ bias), in float32."""
    logits = jnp.einsum("th,he->te", x, router.astype(x.dtype), preferred_element_type=jnp.float32)
    return logits if router_bias is None else logits + router_bias.astype(jnp.float32)


def _split(weight: ExpertWeight) -> tuple[jax.Array, Optional[jax.Array]]:
    return (weight.values, weight.scale) if isinstance(weight, Int8Weight) else (weight, None)


def experts_forward(x: Float[Array, "tokens hidden"], weights: Float32[Array, "tokens k"],
                    ids: Int32[Array, "tokens k"], experts: ExpertWeights, num_rows: Int[Array, ""], *,
                    first_expert: Union[int, Int[Array, ""]] = 0, add_down_bias: Union[bool, jax.Array] = True,
                    activation: Activation = silu_gated) -> Float32[Array, "tokens hidden"]:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) over the experts `experts` holds (ids first_expert ..
    first_expert + E_local - 1; others contribute nothing), in float32. Rows from num_rows on are padding: none
    of their assignments is computed. `add_down_bias`: whether this shard adds the down bias (once per sum)."""
    num_tokens, top_k = ids.shape
    gate_values, gate_scale = _split(experts.gate)
    num_local = gate_values.shape[0]
    local = ids - first_expert
    real_row = (jnp.arange(num_tokens) < num_rows)[:, None]
    mine = real_row & (local >= 0) & (local < num_local)
    flat_expert = jnp.where(mine, local, num_local).reshape(-1)  # num_local: the sentinel group, sorted last
    order = jnp.argsort(flat_expert, stable=True)
    sorted_expert = flat_expert[order]
    sorted_token = order // top_k
    group_sizes = jnp.zeros(num_local, jnp.int32).at[flat_expert].add(1, mode="drop")
    rows = x[sorted_token]
    up_values, up_scale = _split(experts.up)
    down_values, down_scale = _split(experts.down)
    gate, up = expert_matmul_pair(rows, gate_values, up_values, group_sizes, gate_scale, up_scale)
    bias_row = jnp.minimum(sorted_expert, num_local - 1)
    if experts.gate_bias is not None:
        gate = gate + experts.gate_bias[bias_row].astype(gate.dtype)
    if experts.up_bias is not None:
        up = up + experts.up_bias[bias_row].astype(up.dtype)
    out = expert_matmul(activation(gate, up), down_values, group_sizes, down_scale).astype(jnp.float32)
    out = out[:, :x.shape[-1]]  # down's zero columns past hidden (TPU lane padding: runner/expert_lanes.py)
    if experts.down_bias is not None:
        out = out + jnp.where(add_down_bias, experts.down_bias[bias_row].astype(jnp.float32), 0.0)
    sorted_weight = jnp.where(sorted_expert < num_local, weights.reshape(-1)[order], 0.0)
    weighted = out * sorted_weight[:, None]
    # Back to (token, k) order by the inverse permutation (a gather, not a scatter-add), then summed over k.
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    return weighted[inverse].reshape(num_tokens, top_k, -1).sum(axis=1)


def moe_block(x: Float[Array, "tokens hidden"], logits: Float32[Array, "tokens experts"], experts: ExpertWeights,
              routing: MoeRouting, num_rows: Int[Array, ""], *, activation: Activation = silu_gated,
              mesh: Optional[jax.sharding.Mesh] = None, expert_parallel: bool = False) -> Float[Array, "tokens hidden"]:
    """One MoE MLP on the normed input `x` given its router `logits` (router_logits, or the family's own matmul):
    route in float32, compute each token's top-k experts, combine by weight. `mesh` (tp > 1): run per model shard
    (run_sharded), the experts split as `expert_parallel` says; a data axis over 1 (ranks in lock step, the experts
    over dp x tp devices): run_over_ranks, where `num_rows` is not one rank's and every row is computed."""
    weights, ids = route(logits, routing)
    if mesh is None or mesh.size == 1:
        out = experts_forward(x, weights, ids, experts, num_rows, activation=activation)
    elif mesh.shape["data"] > 1:
        out = run_over_ranks(x, weights, ids, experts, mesh, activation)
    else:
        out = run_sharded(x, weights, ids, experts, num_rows, mesh, expert_parallel, activation)
    return out.astype(x.dtype)


def expert_partition_specs(experts: ExpertWeights, expert_parallel: bool,
                           model: Union[str, tuple[str, ...]] = "model") -> Any:
    """Where each expert weight is split over the `model` axis (or axes): the expert axis (expert parallelism), else
    gate/up's output and down's input (the intermediate axis, as the dense MLP). int8 scales follow their output
    axis."""

    def spec(weight, axis_of_split: Optional[int]):
        if weight is None:
            return None
        if isinstance(weight, Int8Weight):
            values = spec(weight.values, axis_of_split)
            scale_axis = 0 if expert_parallel else (1 if axis_of_split == 2 else None)
            return Int8Weight(values, _spec_with(weight.scale.ndim, scale_axis, model))  # type: ignore[arg-type]
        return _spec_with(weight.ndim, 0 if expert_parallel else axis_of_split, model)

    specs: list[Any] = [spec(experts.gate, 2), spec(experts.up, 2), spec(experts.down, 1),
                        spec(experts.gate_bias, 1), spec(experts.up_bias, 1), spec(experts.down_bias, None)]
    return ExpertWeights(*specs)  # the experts' structure, a PartitionSpec (or None) at each leaf


def _spec_with(ndim: int, axis: Optional[int], name: Union[str, tuple[str, ...]]) -> P:
    return P(*[name if i == axis else None for i in range(ndim)])


def run_sharded(x: Float[Array, "tokens hidden"], weights: Float32[Array, "tokens k"], ids: Int32[Array, "tokens k"],
                experts: ExpertWeights, num_rows: Int[Array, ""], mesh: jax.sharding.Mesh, expert_parallel: bool,
                activation: Activation = silu_gated) -> Float32[Array, "tokens hidden"]:
    """experts_forward per model shard in shard_map, tokens replicated, one psum: with `expert_parallel` each shard
    computes its own E / tp experts' assignments; otherwise every expert's 1/tp intermediate slice (the down
    projection's partial sums add up in the psum)."""
    specs = expert_partition_specs(experts, expert_parallel)

    def per_shard(x, weights, ids, experts, num_rows):
        shard = jax.lax.axis_index("model")
        num_local = _split(experts.gate)[0].shape[0]
        first = shard * num_local if expert_parallel else 0
        # The down bias is per expert: with the experts split every shard adds its own; split by width, one does.
        partial = experts_forward(x, weights, ids, experts, num_rows, first_expert=first,
                                  add_down_bias=True if expert_parallel else shard == 0, activation=activation)
        return jax.lax.psum(partial, "model")

    mapped = jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(), P(), specs, P()), out_specs=P(),
                           check_vma=False)
    return mapped(x, weights, ids, experts, num_rows)


def run_over_ranks(x: Float[Array, "tokens hidden"], weights: Float32[Array, "tokens k"], ids: Int32[Array, "tokens k"],
                   experts: ExpertWeights, mesh: jax.sharding.Mesh, activation: Activation = silu_gated,
                   ) -> Float32[Array, "tokens hidden"]:
    """Expert parallelism over every device of ranks in lock step (runner/lock_step.py): the token rows are split
    over the "data" axis (a rank's rows on its devices) and the experts over ("data", "model"), device (d, m)
    holding experts (d * tp + m) * E_local onwards. Each device gathers every rank's rows, computes its own experts'
    assignments, the partial sums add over "model" and are reduce-scattered over "data" back to their rank's rows.

    Every gathered row is computed: padding included (the model's num_rows counts one rank's rows, not these)."""
    axes = ("data", "model")
    specs = expert_partition_specs(experts, True, axes)
    rows = P("data")

    def per_device(x, weights, ids, experts):
        x, weights, ids = (jax.lax.all_gather(a, "data", tiled=True) for a in (x, weights, ids))
        num_local = _split(experts.gate)[0].shape[0]
        device = jax.lax.axis_index("data") * jax.lax.axis_size("model") + jax.lax.axis_index("model")
        partial = experts_forward(x, weights, ids, experts, jnp.int32(x.shape[0]), first_expert=device * num_local,
                                  activation=activation)
        return jax.lax.psum_scatter(jax.lax.psum(partial, "model"), "data", scatter_dimension=0, tiled=True)

    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=(rows, rows, rows, specs), out_specs=rows,
                           check_vma=False)
    return mapped(x, weights, ids, experts)


EXPERT_ACTIVATIONS: dict[str, Activation] = {"silu": silu_gated}
"""The experts' activations by the name a family's config gives (MoeModelConfig.expert_activation)."""
