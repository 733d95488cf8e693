"""The engine's whole jitted step, sharded over a TPU v5e-8 / v6e-8 mesh, compiled by libtpu on a CPU machine, and the
start-up memory plan checked against the HBM XLA:TPU planned for it (`make tpu-compile` runs it after the kernels).

The step is the runner's own (compiled_step.forward_step: embedding, every layer's projections and the attention kernels
per shard in shard_map, the sampled rows' logits, prompt logprobs) with the runner's shardings (runner/mesh.py), the
KV pool in the layout choose_kv_layout picks at this tp and sized per shard as the plan sizes it, and the weights as
ShapeDtypeStructs (nothing is allocated). Per chip, the plan's weights + KV pool must agree with
`compiled.memory_analysis()`'s argument bytes (weights, pool and the step's small inputs) within PLAN_TOLERANCE.
"""

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jaxpaged.models.layers import paged_attention
from jaxpaged.models.llama import LlamaForCausalLM
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.param_shapes import param_shapes
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.batch import PackedLayout, empty_step_inputs, pack_step_inputs
from jaxpaged.runner.compiled_step import forward_step
from jaxpaged.runner.kv_cache import bytes_per_block, choose_kv_layout, kv_storage_dtype
from jaxpaged.runner.kv_spec import build_kv_spec
from jaxpaged.runner.memory_plan import MemoryPlan, plan_memory, weight_bytes_per_device

MIB = 1024 * 1024
STEP_COLUMNS = ("model", "tp", "chip", "layout", "dtype", "blocks", "plan_weights", "plan_kv", "hbm_args", "plan_gap",
                "hbm_temp", "result", "seconds")
PLAN_TOLERANCE = 0.05
"""The plan's weights + KV per chip may differ from XLA:TPU's argument bytes by at most this share."""
KV_BUDGET_BYTES = 8 * 1024 ** 3
"""KV pool per chip (v5e and v6e have 16 and 32 GiB of HBM): sized like kv_cache_memory would size it."""
BLOCK_SIZE = 16
MAX_MODEL_LEN = 8192
NUM_TOKENS, MAX_NUM_SEQS = 256, 64

LLAMA_3_8B = ModelConfig(architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_layers=32, num_q_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
                         rope_theta=5e5, max_position_embeddings=8192, tie_word_embeddings=False)
TINY = dataclasses.replace(LLAMA_3_8B, vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                           num_q_heads=8, num_kv_heads=8, head_dim=128)
STEP_MODELS = {"Llama-3-8B": LLAMA_3_8B, "tiny": TINY}


@dataclasses.dataclass(frozen=True)
class StepCase:
    """One model's step compiled over a chip's (1, tp) mesh."""

    model_name: str
    chip: str
    tp: int = 8
    dtype: str = "bfloat16"
    layout: str = ""
    """The KV layout; "" is what choose_kv_layout picks (packed, or packed_quantized for a quantized kv_cache_dtype)."""
    kv_cache_dtype: str = "auto"


def step_cases(chips) -> list[StepCase]:
    """A tiny and a Llama-3-8B step at tp 8 on each chip, and on the first chip the 8B with the interleaved pool (its
    per-chip tile padding, 8x the packed bytes, is what the plan must now count) and with an int8 KV cache (the packed
    quantized layout, kv_layout_quantized.py; one KV head per shard at page 16: the bfloat16 bytes) and the tiny model
    at tp 2 with an fp8 one (4 heads per shard: about half the bytes)."""
    cases = [StepCase(name, chip) for chip in chips for name in STEP_MODELS]
    return cases + [StepCase("Llama-3-8B", chips[0], layout="interleaved"),
                    StepCase("Llama-3-8B", chips[0], kv_cache_dtype="int8"),
                    StepCase("tiny", chips[0], tp=2, kv_cache_dtype="fp8_e4m3")] if chips else cases


def _mesh(chip: str, tp: int) -> Mesh:
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(topology_name=f"{chip}:2x4", platform="tpu").devices[:tp]
    return Mesh(np.array(devices).reshape(1, tp), (mesh_lib.DATA_AXIS, mesh_lib.MODEL_AXIS))


def _plan(model: ModelConfig, tp: int, dtype, layout: str = "", kv_cache_dtype: str = "auto") -> MemoryPlan:
    """The start-up plan's memory for this model at tp on a TPU, with the pool KV_BUDGET_BYTES per chip."""
    host_params = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in param_shapes(model).items()}
    layout = layout or choose_kv_layout(model, "pallas_tpu", dtype, tp, kv_cache_dtype)
    kv_dtype = kv_storage_dtype(dtype, kv_cache_dtype)
    num_blocks = KV_BUDGET_BYTES // bytes_per_block(model, BLOCK_SIZE, kv_dtype, "tpu", layout, num_shards=tp)
    return plan_memory(model, weight_bytes_per_device(host_params, model, tp, dtype),  # type: ignore[arg-type]
                       int(num_blocks), BLOCK_SIZE, MAX_MODEL_LEN, kv_dtype, tp, layout, platform="tpu")


def _placed(value: jax.ShapeDtypeStruct, name: str, model: ModelConfig, mesh: Mesh) -> jax.ShapeDtypeStruct:
    spec = mesh_lib.param_partition_spec(name, value.shape, model, mesh.shape[mesh_lib.MODEL_AXIS])
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=NamedSharding(mesh, spec))


def _abstract_step(model: ModelConfig, plan: MemoryPlan, mesh: Mesh, dtype, kv_cache_dtype: str = "auto"):
    """(jitted step, its abstract arguments) as ModelRunner builds and warms them up, weights and pool abstract."""
    tp = mesh.shape[mesh_lib.MODEL_AXIS]
    shapes = param_shapes(model)
    abstract = nnx.eval_shape(lambda params: LlamaForCausalLM(model, params),
                              {name: jax.ShapeDtypeStruct(shape, dtype) for name, shape in shapes.items()})
    graphdef, state = nnx.split(abstract)
    # The stored weights (bfloat16 layer stacks are held as uint16 bits), placed as place_params places them.
    state = {key: ({name: _placed(value, f"layers.{name}", model, mesh) for name, value in value.items()}
                   if key == "layers" else _placed(value, key, model, mesh))
             for key, value in nnx.to_pure_dict(state).items()}
    kv_spec = build_kv_spec(model, BLOCK_SIZE, kv_storage_dtype(dtype, kv_cache_dtype), plan.layout, kv_cache_dtype,
                            tp, "tpu")
    kv_sharding = NamedSharding(mesh, mesh_lib.kv_cache_spec(plan.layout))
    kv_cache = jax.ShapeDtypeStruct(kv_spec.pool_shape(plan.num_kv_blocks), kv_spec.pool_dtype, sharding=kv_sharding)
    attend = mesh_lib.shard_attention(functools.partial(paged_attention, backend="pallas_tpu", native_decode=False,
                                                        kv_cache_dtype=kv_cache_dtype, page_size=BLOCK_SIZE), mesh)
    replicated = mesh_lib.replicated(mesh)
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    jitted = jax.jit(functools.partial(forward_step, graphdef, attend), donate_argnums=(1,), static_argnums=(4,),
                     in_shardings=(state_shardings, kv_sharding, replicated, replicated),
                     out_shardings=(replicated, kv_sharding, replicated))
    example = empty_step_inputs(NUM_TOKENS, MAX_NUM_SEQS, -(-MAX_MODEL_LEN // BLOCK_SIZE))
    packed = pack_step_inputs(example)
    batch = jax.ShapeDtypeStruct(packed.shape, packed.dtype, sharding=replicated)
    previous = jax.ShapeDtypeStruct((MAX_NUM_SEQS,), jnp.int32, sharding=replicated)
    return jitted, (state, kv_cache, batch, previous, PackedLayout.of(example))


def _judge(gap: float, checked: bool) -> str:
    """OK when the plan is within PLAN_TOLERANCE of XLA:TPU's bytes. A layout the engine does not pick at this tp is
    compiled (it must not be rejected) but its plan not held to the bound: XLA:TPU stores the interleaved shard
    [.., page, 2, 128] of one head in bfloat16 without the 16-sublane padding physical_bytes counts
    (docs/tpu-compile.md)."""
    if abs(gap) <= PLAN_TOLERANCE:
        return "OK"
    return f"plan off by {gap:+.1%} (> {PLAN_TOLERANCE:.0%})" if checked else "OK (compiled; plan not checked)"


def compile_step(case: StepCase) -> dict:
    """Compile one case; the table row, with the plan's HBM per chip beside XLA:TPU's and whether they agree."""
    model, dtype = STEP_MODELS[case.model_name], jnp.dtype(case.dtype)
    mesh = _mesh(case.chip, case.tp)
    plan = _plan(model, case.tp, dtype, case.layout, case.kv_cache_dtype)
    planned = plan.weight_bytes_per_device + plan.num_kv_blocks * plan.kv_bytes_per_block_per_device
    row = dict(model=f"{case.model_name} step", tp=case.tp, chip=f"{case.chip}-8", layout=plan.layout,
               dtype=case.dtype if case.kv_cache_dtype == "auto" else f"{case.dtype}, KV {case.kv_cache_dtype}",
               blocks=plan.num_kv_blocks, plan_weights=f"{plan.weight_bytes_per_device / MIB:.0f}M",
               plan_kv=f"{plan.num_kv_blocks * plan.kv_bytes_per_block_per_device / MIB:.0f}M")
    started = time.perf_counter()
    try:
        with jax.default_device(mesh.devices.flat[0]):
            jitted, args = _abstract_step(model, plan, mesh, dtype, case.kv_cache_dtype)
            stats = jitted.lower(*args).compile().memory_analysis()
        assert stats is not None, "XLA:TPU plans memory for every executable"
        gap = stats.argument_size_in_bytes / planned - 1
        row |= dict(hbm_args=f"{stats.argument_size_in_bytes / MIB:.0f}M", plan_gap=f"{gap:+.2%}",
                    hbm_temp=f"{stats.temp_size_in_bytes / MIB:.0f}M",
                    result=_judge(gap, checked=not case.layout))
    except Exception as error:  # noqa: BLE001 - the compiler's rejection is the row's result
        row |= dict(hbm_args="-", hbm_temp="-", plan_gap="-", result=str(error).splitlines()[0][:240])
    row["seconds"] = f"{time.perf_counter() - started:.1f}"
    return row
