"""The device mesh of one engine rank, and where every array of the step lives on it.

The only module that knows the axis names. A rank's mesh has axes ("data", "model") with shape (1, tp): data
parallelism is one rank per device group (each with its own block pool and scheduler, see engine/ranks.py), tensor
parallelism is the "model" axis, Megatron style:
  - q/k/v and gate/up are column-parallel (their output axis sharded), o and down row-parallel (input axis
    sharded), so each layer needs one all-reduce after attention and one after the MLP; XLA's SPMD partitioner
    inserts them from these parameter shardings.
  - The embedding and the vocabulary projection are sharded on the vocabulary; only the sampled rows' logits
    are gathered (the step's output is those rows).
  - The paged KV cache is sharded by heads on its axis -2 in every layout (kv_layout.py): the interleaved
    layout's 2 * kv_heads axis (K/V of head h at 2h and 2h+1, so a contiguous shard holds whole (K, V) pairs), the
    packed layout's row axis (shard-major: each shard's rows are the packed layout of its own heads). With fewer
    KV heads than tp, each KV head is repeated at load time (never per step) so every shard owns exactly one.
  - Attention runs per shard inside shard_map: every backend (Pallas kernels included) sees only its heads.
Ranks in lock step (a mixture of experts with its experts over dp x tp devices, runner/lock_step.py) share one
(dp, tp) mesh instead: the step's token rows and the KV pool's layer slots gain the "data" axis, each data shard
holding one rank's, and the experts split their expert axis over ("data", "model").
"""

import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from jaxpaged.models.int8_weights import SCALE_SUFFIX, is_scale, stored_dtype
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.packed_weights import is_packed, pack_param
from jaxpaged.runner.zero_padded import HostWeight

DATA_AXIS, MODEL_AXIS = "data", "model"

# Parameter name (after "layers.") -> which axis of the unstacked weight is split over MODEL_AXIS.
_COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",  # [hidden, out]: out is split
                    "shared_gate", "shared_up")                            # (a MoE's shared expert's too)
_ROW_PARALLEL = ("o_proj", "down_proj", "shared_down")                      # [in, hidden]: in is split
_HEAD_BIASES = ("q_bias", "k_bias", "v_bias")                               # [heads * head_dim]: split
# A mixture of experts' weights (models/moe.py), unstacked [experts, ...]: without expert parallelism, the axis that
# is split like the dense MLP's (gate/up's intermediate output, down's intermediate input; None: kept whole).
_EXPERT_WIDTH_AXIS = {"expert_gate": 2, "expert_up": 2, "expert_down": 1, "expert_gate_bias": 1,
                      "expert_up_bias": 1, "expert_down_bias": None, "expert_gate_scale": 1, "expert_up_scale": 1,
                      "expert_down_scale": None}


def check_parallel_layout(model: ModelConfig, tensor_parallel_size: int, data_parallel_size: int,
                          num_devices: int, num_processes: int = 1) -> None:
    """ValueError naming the option, the model's head counts and the device count when a layout cannot work."""
    heads = f"(model: {model.num_q_heads} q heads, {model.num_kv_heads} kv heads; {num_devices} devices)"
    tp, dp = tensor_parallel_size, data_parallel_size
    if tp * dp > num_devices:
        raise ValueError(f"tensor_parallel_size: tensor_parallel_size ({tp}) x data_parallel_size ({dp}) = "
                         f"{tp * dp} devices are needed, but only {num_devices} exist {heads}")
    if tp % num_processes:
        # Process 0 schedules every rank and samples from its own copy of each rank's logits, so every rank's
        # devices must include devices of every process.
        raise ValueError(f"tensor_parallel_size: {tp} must be a multiple of the number of processes "
                         f"({num_processes}) so each data-parallel rank spans every host {heads}")
    if model.num_q_heads % tp:
        raise ValueError(f"tensor_parallel_size: {tp} must divide the number of q heads {heads}")
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ValueError(f"tensor_parallel_size: {tp} must divide the number of kv heads, or be a multiple of it "
                         f"so each kv head is replicated evenly {heads}")
    if model.intermediate_size % tp:
        raise ValueError(f"tensor_parallel_size: {tp} must divide the MLP's intermediate size "
                         f"{model.intermediate_size} {heads}")
    num_experts = getattr(model, "num_experts", 0)
    if num_experts and getattr(model, "expert_parallel", False) and dp > 1:
        # The experts span every rank's devices, so the ranks step in lock step as one program (lock_step.py).
        if num_processes > 1:
            raise ValueError(f"enable_expert_parallel: experts over data_parallel_size ({dp}) x "
                             f"tensor_parallel_size ({tp}) devices run on one host only, got {num_processes} "
                             f"processes {heads}")
        if num_experts % (dp * tp):
            raise ValueError(f"enable_expert_parallel: data_parallel_size ({dp}) x tensor_parallel_size ({tp}) = "
                             f"{dp * tp} devices must divide the number of experts ({num_experts}) {heads}")
    if num_experts and getattr(model, "expert_parallel", False) and num_experts % tp:
        raise ValueError(f"tensor_parallel_size: {tp} must divide the number of experts ({num_experts}) under "
                         f"enable_expert_parallel {heads}")
    expert_width = getattr(model, "moe_intermediate_size", 0)
    if num_experts and not getattr(model, "expert_parallel", False) and expert_width % tp:
        raise ValueError(f"tensor_parallel_size: {tp} must divide the experts' intermediate size {expert_width} "
                         f"(or set enable_expert_parallel) {heads}")


def rank_meshes(tensor_parallel_size: int, data_parallel_size: int,
                devices: Optional[Sequence[Any]] = None) -> list[Mesh]:
    """One (1, tp) mesh per data-parallel rank, over the first dp * tp devices in order.

    Across several processes (hosts), rank r takes the r-th tp / num_processes local devices of every process,
    so each rank spans every host (see check_parallel_layout).
    """
    devices = list(jax.devices() if devices is None else devices)
    by_process: dict[int, list] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    if tensor_parallel_size % len(by_process):  # only one process's devices can be used: the first ones
        by_process = {0: devices}
    per_process = tensor_parallel_size // len(by_process)
    meshes = []
    for rank in range(data_parallel_size):
        group = [device for local in by_process.values()
                 for device in local[rank * per_process:(rank + 1) * per_process]]
        meshes.append(Mesh(np.array(group).reshape(1, tensor_parallel_size), (DATA_AXIS, MODEL_AXIS)))
    return meshes


def lock_step_mesh(tensor_parallel_size: int, data_parallel_size: int,
                   devices: Optional[Sequence[Any]] = None) -> Mesh:
    """One (dp, tp) mesh over the first dp * tp devices, rank r on row r: ranks in lock step (one process)."""
    devices = list(jax.devices() if devices is None else devices)[:tensor_parallel_size * data_parallel_size]
    return Mesh(np.array(devices).reshape(data_parallel_size, tensor_parallel_size), (DATA_AXIS, MODEL_AXIS))


def replicate_kv_heads(params: dict[str, np.ndarray], model: ModelConfig,
                       tensor_parallel_size: int) -> tuple[dict[str, np.ndarray], ModelConfig]:
    """Repeat each KV head tp / kv_heads times (in k/v projections and biases) when tp exceeds the kv heads.

    New kv head j is old head j // repeats, and q head i reads new kv head i // (group / repeats), which is old
    head i // group: attention is unchanged, and every model shard now owns one whole KV head.
    """
    if model.num_kv_heads >= tensor_parallel_size:
        return params, model
    repeats = tensor_parallel_size // model.num_kv_heads
    head_dim = model.head_dim
    out = dict(params)
    for name in ("layers.k_proj", "layers.v_proj", "layers.k_bias", "layers.v_bias", "layers.k_proj_scale",
                 "layers.v_proj_scale"):
        if name in params:
            weight = params[name]
            heads = weight.reshape(*weight.shape[:-1], model.num_kv_heads, head_dim)
            out[name] = np.repeat(heads, repeats, axis=-2).reshape(*weight.shape[:-1], -1)
    return out, dataclasses.replace(model, num_kv_heads=model.num_kv_heads * repeats)


def param_partition_spec(name: str, shape: tuple[int, ...], model: ModelConfig, tp: int) -> P:
    """The PartitionSpec of one parameter (stacked layer weights have a leading, unsplit layer axis). An int8
    weight splits as its float would; its scales [layers, outer] split as its output axis: a column-parallel
    projection's with it, a row-parallel one's (output: the hidden size) not at all. Expert weights [layers,
    experts, ...] split on the expert axis under expert parallelism (model.expert_parallel), else as the dense MLP."""
    expert_spec = _expert_partition_spec(name, shape, model)
    if expert_spec is not None:
        return expert_spec
    if is_scale(name):
        base = name[len("layers."):-len(SCALE_SUFFIX)]
        return P(*([None] * (len(shape) - 1)), MODEL_AXIS) if base in _COLUMN_PARALLEL else P()
    if name.startswith("layers."):
        base = name[len("layers."):]
        if base in _COLUMN_PARALLEL or base in _HEAD_BIASES:
            return P(*([None] * (len(shape) - 1)), MODEL_AXIS)
        if base in _ROW_PARALLEL:
            return P(None, MODEL_AXIS, None)
        return P()  # norms: tiny, every shard needs them whole
    if name == "embed" and model.vocab_size % tp == 0:
        return P(MODEL_AXIS, None)
    if name == "lm_head" and model.vocab_size % tp == 0:
        return P(None, MODEL_AXIS)
    return P()  # a vocabulary tp does not divide: replicated (small models only)


def _expert_partition_spec(name: str, shape: tuple[int, ...], model: ModelConfig) -> Optional[P]:
    """A stacked expert weight's spec (None for any other parameter): its expert axis (1) split under expert
    parallelism, else its _EXPERT_WIDTH_AXIS (shifted past the layer axis)."""
    base = name[len("layers."):] if name.startswith("layers.") else ""
    if base not in _EXPERT_WIDTH_AXIS:
        return None
    width_axis = _EXPERT_WIDTH_AXIS[base]
    axis = 1 if getattr(model, "expert_parallel", False) else (None if width_axis is None else width_axis + 1)
    return P(*[expert_axes(model) if index == axis else None for index in range(len(shape))])


def expert_axes(model: ModelConfig) -> Union[str, tuple[str, str]]:
    """The mesh axes an expert weight's split axis spans: ("data", "model") for experts over ranks in lock step
    (device (d, m) holds expert block d * tp + m), else the model axis."""
    return (DATA_AXIS, MODEL_AXIS) if getattr(model, "expert_data_parallel", 1) > 1 else MODEL_AXIS


def kv_cache_spec(layout: str = "interleaved", over_ranks: bool = False) -> P:
    """Interleaved [layers, blocks, block_size, 2 * kv_heads, head_dim] (floats or bfloat16 bits): split on the
    kv-head axis; packed [layers, blocks, tp * block_size * rows, 128] and packed quantized [layers, blocks, tp *
    page_rows, 128]: split on their shard-major row axis. `over_ranks`: the pool of ranks in lock step, [ranks *
    layers, ...], its axis 0 split over the data axis too (each rank's layer slots on its own devices)."""
    return _split_on_axis_minus_2(4 if layout in ("packed", "packed_quantized") else 5, over_ranks)


def _split_on_axis_minus_2(ndim: int, over_ranks: bool = False) -> P:
    """Every KV layout splits by heads on its axis -2: the pool ([layers, blocks, *page]) and a layer stack of its
    pages ([layers * blocks, *page]) alike; `over_ranks`: axis 0 (rank-major) over the data axis."""
    return P(DATA_AXIS if over_ranks else None, *([None] * (ndim - 3)), MODEL_AXIS, None)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device of the rank holds the whole array (step inputs, logits, sampler batches)."""
    return NamedSharding(mesh, P())


def place_params(params: Mapping[str, HostWeight], model: ModelConfig, mesh: Mesh, dtype, *,
                 per_layer: bool = False, pack: bool = False, pack_int8: bool = False, int8_vnni: bool = False,
                 int8_pairs: bool = False, progress: Optional[bool] = None,
                 ) -> dict[str, Union[jax.Array, list[jax.Array]]]:
    """Each device receives only its shard, converted to `dtype` slice by slice (no whole-model copy).

    per_layer: each stacked layer weight ("layers.*") becomes a list of one array per layer, placed layer by layer,
    so no stacked copy exists on the device even for a moment (llama.DecoderLayers says when the model wants that).
    pack: matmul weights are packed on the host into the native CPU matmul's panels first (packed_weights.py; one
    device, so nothing is split). pack_int8: the same for int8 projections (their scales stay [outer] per layer);
    `int8_vnni`: in the native VNNI matmul's layout (w8a8, vnni_matmul.py) rather than int8 panels; `int8_pairs`: in
    the bfloat16-dot matmul's pair order (int8_bf16_matmul.py).
    progress: a bar of weights placed on stderr (None: when stderr is a terminal); the global weights are still
    memory-mapped, so their bytes are read here (the layers' were read, and quantized, by weights/param_names.py's
    stack_layers, which has its own bar).
    """
    tp = mesh.shape[MODEL_AXIS]
    if (pack or pack_int8) and (tp != 1 or not per_layer):
        raise ValueError(f"packed weights are placed per layer on one device per rank, got tp={tp}, "
                         f"per_layer={per_layer}")

    def place(host: HostWeight, spec: P) -> jax.Array:
        target = stored_dtype(name, host.dtype, dtype)  # int8 weights and their scales keep their own dtypes
        return jax.make_array_from_callback(host.shape, NamedSharding(mesh, spec),
                                            lambda index: np.asarray(host[index], dtype=target))

    placed: dict[str, Union[jax.Array, list[jax.Array]]] = {}
    bar = tqdm(params.items(), desc="Loading weights", unit="tensor", file=sys.stderr, leave=False,
               disable=None if progress is None else not progress)
    for name, value in bar:
        spec = param_partition_spec(name, value.shape, model, tp)
        quantized = value.dtype == np.int8
        if (pack_int8 if quantized else pack) and is_packed(name, value.shape, model):
            packed_dtype = np.int8 if quantized else dtype
            if name.startswith("layers."):
                placed[name] = [place(pack_param(name, layer, packed_dtype, quantized and int8_vnni,
                                                 quantized and int8_pairs), P()) for layer in value]
            else:
                placed[name] = place(pack_param(name, np.asarray(value), dtype), P())
        elif per_layer and name.startswith("layers."):
            placed[name] = [place(layer, P(*spec[1:])) for layer in value]  # the spec less the layer axis
        else:
            placed[name] = place(value, spec)
    return placed


def shard_attention(attend: Callable, mesh: Mesh) -> Callable:
    """Run `attend(q, k, v, kv_pages, first_page, metadata, layer_is_sliding, sinks=..., **static)` per model
    shard: each sees its heads, and its own q heads' attention sinks (sinks [num_q_heads] split like q's heads).
    Ranks in lock step (a data axis over 1): per (rank, model shard), each rank's token rows, metadata (every leaf
    rank-major on axis 0) and pool layer slots on its own data shard, so the backend sees one rank's step."""
    over_ranks = mesh.shape[DATA_AXIS] > 1
    heads = P(DATA_AXIS if over_ranks else None, MODEL_AXIS, None)

    def per_shard(q, k, v, kv_pages, first_page, metadata, layer_is_sliding=None, *, sinks=None, **static):
        args = (q, k, v, kv_pages, first_page, metadata)
        if layer_is_sliding is not None:
            args += (layer_is_sliding,)
        specs = (heads, heads, heads, _split_on_axis_minus_2(kv_pages.ndim, over_ranks), P(),
                 P(DATA_AXIS) if over_ranks else P()) + (P(),) * (len(args) - 6)
        body = functools.partial(attend, **static)
        if sinks is not None:  # traced (a layer's weights): passed through shard_map, split by q head
            body = functools.partial(_sinks_as_keyword, attend, static)
            args += (sinks,)
            specs += (P(MODEL_AXIS),)
        # NOTE: check_vma=False because Pallas kernels in interpret mode carry no varying-axes annotations.
        mapped = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(heads, specs[3]), check_vma=False)
        return mapped(*args)

    return per_shard


def _sinks_as_keyword(attend: Callable, static: dict, *args):
    """attend(*args[:-1], sinks=args[-1], **static): shard_map passes arrays positionally."""
    *args, sinks = args
    return attend(*args, sinks=sinks, **static)
