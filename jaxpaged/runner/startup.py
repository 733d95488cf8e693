"""StartupPlan: every start-up decision of a rank, made once from the config and the devices, frozen, and logged
as one block. ModelRunner executes it: it places the weights as the plan says, allocates the pool the plan sized
and compiles the step the plan describes; nothing after start-up decides any of it again.

The decisions, in the order they depend on each other: the dtype ("auto" probes a CPU once), the attention
backend, the layer arrangement (per-layer and unrolled on a CPU, stacked and scanned elsewhere), weight packing
for the native CPU matmul, the native CPU attention kernel, the KV format and layout, the block count and the memory
plan.
"""

import dataclasses
import logging
from collections.abc import Mapping
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.config import EngineConfig
from jaxpaged.kernels.attention_dispatch import check_kv_cache_dtype, resolve_attention_backend
from jaxpaged.kernels.cpu_native.paged_decode import native_decode_available
from jaxpaged.models.llama import unroll_layers_on
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.moe import expert_matmul_name
from jaxpaged.models.moe_decoder import MoeModelConfig
from jaxpaged.models.packed_weights import packs_weights_on
from jaxpaged.runner.dtype_probe import probe_cpu_dtype
from jaxpaged.runner.int8_probe import choose_int8_matmul, probe_shapes
from jaxpaged.runner.kv_cache import bytes_per_block, choose_kv_layout, kv_storage_dtype, num_kv_blocks_in_budget
from jaxpaged.runner.kv_spec import KVSpec, build_kv_spec
from jaxpaged.runner.memory_plan import (
    MemoryPlan,
    check_weights_fit,
    device_memory_bytes,
    fit_max_model_len,
    memory_plan_for,
    weight_bytes_per_device,
    weight_format,
)
from jaxpaged.runner.zero_padded import HostWeight

logger = logging.getLogger(__name__)

def resolve_dtype(name: str, native_matmul: bool = True) -> jnp.dtype:
    """ "auto" is bfloat16 on TPU/GPU and, on a CPU, whichever the start-up probe finds faster (dtype_probe.py) with
    the matmuls the engine will run (`native_matmul`: config.cpu_matmul is "native"); always a numpy dtype (its str
    is the plain name)."""
    if name != "auto":
        return jnp.dtype(name)
    if jax.default_backend() != "cpu":
        return jnp.dtype(jnp.bfloat16)
    if jax.process_count() > 1:
        # Every process must build the same step; timings on different hosts could disagree.
        return jnp.dtype(jnp.float32)
    return probe_cpu_dtype(native_matmul).choice


@dataclasses.dataclass(frozen=True)
class StartupPlan:
    """What a rank runs with; see the module docstring for the order of the decisions."""

    platform: str
    """The rank's devices: "cpu", "gpu" or "tpu"."""
    devices: tuple[int, ...]
    """Device ids of the rank's (1, tp) mesh."""
    tensor_parallel_size: int
    dtype: np.dtype
    """Weights and activations (config.dtype resolved)."""
    attention_backend: str
    """"xla", "pallas_tpu" or "pallas_gpu" (config.attention_backend resolved for the platform)."""
    per_layer: bool
    """Weights stored per layer and the layers unrolled (the CPU: XLA:CPU copies a scanned layer's weights);
    otherwise stacked on a leading axis and scanned, one compiled layer body."""
    packed_weights: bool
    """Matmul weights packed into panels at load for the native CPU matmul (else XLA's dot)."""
    native_decode: bool
    """Decode rows read their KV in place through the native CPU attention kernel (else the jnp path)."""
    kv_spec: KVSpec
    """One KV block: layout, dtypes, page size, bytes and layer groups (every reader of the pool's shape takes it)."""
    memory: MemoryPlan
    quantization: Optional[str] = None
    """"int8": the projections are int8 with per-column scales (models/int8_weights.py); "w8a8": and their matmuls
    quantize their inputs per token (models/int8_activations.py)."""
    int8_matmul: Optional[str] = None
    """How the int8 projections multiply (None without them): "panels" (packed into panels for the native CPU int8
    matmul, widened to float32), "int16 digits" (inputs kept to 16 bits as two int8 digits,
    models/int16_activations.py), "w8a8" (inputs quantized to int8 per token), "vnni w8a8" (the same product on
    the native VNNI matmul, kernels/cpu_native/vnni_matmul.py), "vnni digits" (int16 digits on it), "bf16 panels"
    (int8 panels widened to bfloat16 against inputs rounded to bfloat16, VDPBF16PS: int8_bf16_matmul.py) or "xla" (XLA's
    dot with the int8 convert fused into its operand, scales on the output: TPU, GPU; on a CPU whichever
    int8_probe.py times fastest)."""
    experts: str = ""
    """A mixture of experts' layout and placement, for the log ("" for a dense model: describe_experts)."""
    lock_step_ranks: int = 1
    """Data-parallel ranks stepping together over one (dp, tp) mesh (runner/lock_step.py); 1: a rank of its own."""

    @property
    def kv_layout(self) -> str:
        """The KV pool's layout (pallas_kernels/ragged_paged_attention/kv_layout.py)."""
        return self.kv_spec.layout

    @property
    def kv_cache_dtype(self) -> str:
        """config.cache.kv_cache_dtype ("fp8" as "fp8_e4m3"): "auto" stores K/V in dtype, "int8" / "fp8_e4m3"
        quantized with per-token-per-head scales (the "quantized" layout, or "packed_quantized" on pallas_tpu)."""
        return self.kv_spec.kv_cache_dtype

    @property
    def kv_storage_dtype(self) -> np.dtype:
        """The KV pool's element dtype (int8 / uint8 codes and scale bytes, or dtype)."""
        return self.kv_spec.storage_dtype

    @property
    def packed_int8(self) -> bool:
        """The int8 projections are stored packed: as panels for the native CPU int8 matmul, or for the VNNI one."""
        return self.int8_matmul in ("panels", "vnni w8a8", "vnni digits", "bf16 panels")

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return self.memory.num_kv_blocks

    def describe(self) -> str:
        """The plan as one log block, a decision per line."""
        matmuls = "native, packed weights" if self.packed_weights else "XLA dot"
        if self.quantization is not None:
            kernel = _INT8_MATMUL_DESCRIPTIONS[self.int8_matmul or "xla"]
            matmuls += f"; {self.quantization} projections: {kernel}"
        attention = self.attention_backend + (" + native CPU decode" if self.native_decode else "")
        ranks = f", dp={self.lock_step_ranks} in lock step" if self.lock_step_ranks > 1 else ""
        lines = [f"start-up plan: devices [{', '.join(map(str, self.devices))}] ({self.platform}, "
                 f"tp={self.tensor_parallel_size}{ranks})",
                 f"  dtype {self.dtype}; layers {'per layer, unrolled' if self.per_layer else 'stacked, scanned'}",
                 f"  matmuls: {matmuls}; attention: {attention}",
                 f"  KV: {self.kv_layout} layout, {self.num_kv_blocks} blocks, kv_cache_dtype {self.kv_cache_dtype}",
                 *([f"  {self.experts}"] if self.experts else []),
                 f"  {self.memory.describe()}"]
        return "\n".join(lines)


def plan_startup(model: ModelConfig, params: Mapping[str, HostWeight], config: EngineConfig,
                 mesh: jax.sharding.Mesh, quantization: Optional[str] = None) -> StartupPlan:
    """Decide everything a rank over `mesh` runs with (`model` and `params` after any kv-head replication;
    `quantization`: the scheme of params' int8 projections, "int8" when None and some are int8); ValueError naming
    the option when the weights or one max_model_len sequence cannot fit."""
    tp = mesh.shape["model"]
    first_device = mesh.devices.flat[0]
    platform = first_device.platform
    dtype = resolve_dtype(config.dtype, native_matmul=config.cpu_matmul == "native")
    backend = resolve_attention_backend(config.attention_backend)
    weight_bytes = weight_bytes_per_device(params, model, tp, dtype)
    check_weights_fit(weight_bytes, device_memory_bytes(first_device), tp, dtype)
    per_layer = unroll_layers_on(platform)
    packed = per_layer and config.cpu_matmul == "native" and packs_weights_on(platform, dtype, tp)
    native_decode = (platform == "cpu" and backend == "xla" and config.cpu_attention == "native"
                     and native_decode_available())
    kv_cache_dtype = config.cache.kv_cache_dtype
    check_kv_cache_dtype(kv_cache_dtype, backend)
    kv_layout = choose_kv_layout(model, backend, dtype, tp, kv_cache_dtype)
    if kv_layout == "packed_quantized":
        _check_tpu_quantized_block(model, config, dtype, platform, tp)
    kv_spec = build_kv_spec(model, config.cache.block_size, kv_storage_dtype(dtype, kv_cache_dtype), kv_layout,
                            kv_cache_dtype, num_shards=tp, hybrid=hybrid_kv_groups(model, config))
    # NOTE: the weights are placed after the plan is made; the pool's default size leaves room for them.
    num_kv_blocks = num_kv_blocks_in_budget(config.cache, kv_spec.bytes_per_block_per_device,
                                            pending_weight_bytes=weight_bytes)
    max_model_len = config.scheduler.max_model_len
    if max_model_len is None:
        max_model_len = fit_max_model_len(model.max_position_embeddings, num_kv_blocks, config.cache.block_size,
                                          kv_spec.group_windows, config.scheduler.max_num_batched_tokens)
    memory = memory_plan_for(kv_spec, weight_bytes, num_kv_blocks, max_model_len, weight_format(params, dtype),
                             config.scheduler.max_num_batched_tokens)
    memory.check()
    quantized = any(value.dtype == np.int8 for value in params.values())
    scheme = (quantization or "int8") if quantized else None
    int8_matmul = choose_int8_matmul(scheme, platform, per_layer, tp, config.cpu_matmul == "native",
                                     probe_shapes(params, config, dtype, packed))
    return StartupPlan(platform, tuple(int(d.id) for d in mesh.devices.flat), tp, dtype, backend, per_layer, packed,
                       native_decode, kv_spec, memory, scheme, int8_matmul,
                       describe_experts(model, params, tp, dtype, platform), mesh.shape["data"])


def describe_experts(model: ModelConfig, params: Mapping[str, HostWeight], tp: int, dtype,
                     platform: str = "cpu") -> str:
    """The plan's MoE line: experts and top-k, how routing and the expert matmuls run, where the experts live and
    their bytes per device; "" for a dense model."""
    if not isinstance(model, MoeModelConfig) or not model.has_experts:
        return ""
    routing = model.routing
    moe_layers = sum(model.layer_has_experts(layer) for layer in range(model.num_layers))
    experts = {name: value for name, value in params.items() if name.startswith("layers.expert_")}
    quantized = any(value.dtype == np.int8 for value in experts.values())
    ranks = model.expert_data_parallel
    if ranks > 1:
        devices = ranks * tp
        placement = (f"experts over dp x tp = {devices} devices, E/{devices} each ({model.num_experts // devices} "
                     f"whole experts), the {ranks} data-parallel ranks in lock step: every rank's tokens gathered, "
                     f"psum over tp, reduce-scattered back to their rank")
    elif tp == 1:
        placement = "all experts on the one device"
    elif model.expert_parallel:
        placement = f"expert parallel: {model.num_experts // tp} whole experts per device over tp={tp}, psum"
    else:
        placement = f"every expert's width split over tp={tp} (no expert parallelism), psum"
    stored_width, stored_hidden = (experts["layers.expert_down"].shape[-2:] if "layers.expert_down" in experts
                                   else (model.moe_intermediate_size, model.hidden_size))
    if (stored_width, stored_hidden) != (model.moe_intermediate_size, model.hidden_size):
        placement += (f"; padded to 128-lane columns at load (width {model.moe_intermediate_size} -> {stored_width}, "
                      f"hidden {model.hidden_size} -> {stored_hidden})")
    return (f"experts: {routing.num_experts} per layer in {moe_layers} of {model.num_layers} layers, top "
            f"{routing.top_k} ({routing.style}{', renormalised' if routing.renormalize else ''}), width "
            f"{model.moe_intermediate_size}{', int8' if quantized else ''}; dropless, sorted by expert, grouped "
            f"matmul: {expert_matmul_name(platform, np.int8 if quantized else dtype)}; {placement}; "
            f"{weight_bytes_per_device(experts, model, tp, dtype) / 2**20:.1f} MiB of experts per device")


def hybrid_kv_groups(model: ModelConfig, config: EngineConfig) -> bool:
    """Whether sliding-window layers get KV cache groups of their own (runner/kv_spec.py): unless
    disable_hybrid_kv_cache_manager says no. The KV tiers and KV events work per group (core/kv_group_keys.py), and
    so does multi-host serving: process 0's scheduler plans every group's tables and each step's broadcast carries
    them (multihost/step_plan.py)."""
    return not config.cache.disable_hybrid_kv_cache_manager and model.sliding_window is not None


def _check_tpu_quantized_block(model: ModelConfig, config: EngineConfig, dtype, platform: str, tp: int) -> None:
    """The TPU's quantized KV layout packs 4 tokens per 32-bit word and pads a page to whole (8, 128) tiles:
    ValueError naming block_size if a block is no multiple of 4 tokens; a warning when the padding leaves the 8-bit
    block no smaller than a bfloat16 one (one KV head per shard at block size 16: kv_layout_quantized.py)."""
    block_size, kv_cache_dtype = config.cache.block_size, config.cache.kv_cache_dtype
    if block_size % 4:
        raise ValueError(f"block_size: kv_cache_dtype {kv_cache_dtype!r} on pallas_tpu packs 4 tokens' codes per "
                         f"32-bit word, so a block holds a multiple of 4 tokens; got {block_size}")
    quantized = bytes_per_block(model, block_size, kv_storage_dtype(dtype, kv_cache_dtype), platform,
                                layout="packed_quantized", num_shards=tp)
    bfloat16 = bytes_per_block(model, block_size, jnp.bfloat16, platform, layout="packed", num_shards=tp)
    if quantized >= bfloat16:
        logger.warning("kv_cache_dtype %r at block_size %d saves no KV memory on this TPU layout (%d bytes per block "
                       "per device, bfloat16's %d: %d KV head(s) per device pad a page to whole tiles); a block_size "
                       "of 64 or more saves about a third", kv_cache_dtype, block_size, quantized, bfloat16,
                       model.num_kv_heads // tp)


_INT8_MATMUL_DESCRIPTIONS = {
    "panels": "native, packed int8 panels",
    "int16 digits": "XLA int8 x int8 dot of 16-bit inputs as two int8 digits, int32 sums",
    "w8a8": "XLA int8 x int8 dot, int32 sums",
    "vnni w8a8": "native VNNI int8 x int8 (VPDPBUSD), packed weights, int32 sums",
    "vnni digits": "native VNNI int8 x int8 (VPDPBUSD) of 16-bit inputs as two int8 digits, packed weights",
    "bf16 panels": "native bfloat16 pair dot (VDPBF16PS) of inputs rounded to bfloat16, int8 panels widened in the "
                   "kernel, float32 sums",
    "xla": "XLA dot, scales on the output",
}


def log_plan(plan: StartupPlan, rank: Optional[int] = None) -> None:
    """The plan as one INFO block (per data-parallel rank when there are several)."""
    logger.info("%s%s", "" if rank is None else f"rank {rank} ", plan.describe())
