"""Pre-quantized int8 checkpoints in the compressed-tensors format (llm-compressor's output, as vLLM reads it).

config.json carries a `quantization_config` with `quant_method: "compressed-tensors"`, a `format`
("int-quantized" or "naive-quantized": one int8 per weight, no packing) and `config_groups`, each a scheme:
`weights` (num_bits 8, type int, symmetric) quantized per output channel ("channel": weight_scale [out, 1]), per
tensor ("tensor": weight_scale [1]) or per group of input columns ("group": weight_scale [out, in / group_size]),
and `input_activations` absent (W8A16, weight-only) or dynamic per-token int8 (W8A8). A quantized Linear's tensors
are `<module>.weight` (int8, [out, in]) and `<module>.weight_scale`; modules on the `ignore` list (lm_head,
typically) stay float.

jaxpaged reads the file's tensors as they are, not the config's target patterns: an int8 tensor with its
weight_scale is taken into the int8 representation (models/int8_weights.py) directly: channel and tensor scales
as they stand (exactly the checkpoint's weights), group scales requantized per output channel (one more rounding,
logged); a float projection (ignored in the checkpoint) is quantized per channel as it loads; an int8 lm_head or
embedding is dequantized (the engine keeps them in the model dtype). Everything in the config is checked before any
weight is read, and anything jaxpaged cannot run is a ValueError naming the config field.
"""

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from jaxpaged.models.int8_weights import HostInt8, requantize_rows
from jaxpaged.weights.safetensors_file import TensorEntry, open_tensor

CONFIG_KEY = "quantization_config"
QUANT_METHOD = "compressed-tensors"
"""quant_method of this format, and the --quantization value that means "as the checkpoint says"."""
_FORMATS = ("int-quantized", "naive-quantized")
_STRATEGIES = ("channel", "tensor", "group")
SCHEME_NAMES = {False: "int8", True: "w8a8"}
"""The jaxpaged scheme of a checkpoint without (W8A16) / with (W8A8) input activation quantization."""


@dataclasses.dataclass(frozen=True)
class CheckpointQuantization:
    """What a compressed-tensors checkpoint's quantization_config says, checked."""

    scheme: str
    """"int8" (W8A16: weights only) or "w8a8" (weights and dynamic per-token int8 activations)."""
    strategy: str
    """Weight scales per "channel", per "tensor" or per "group" of input columns."""
    group_size: Optional[int]
    """Input columns per scale for the "group" strategy; None otherwise."""
    ignore: tuple[str, ...]
    """Modules the checkpoint left unquantized (names or "re:" patterns), as the config lists them."""


def _require(ok: bool, field: str, message: str) -> None:
    """ValueError naming `field` (a path inside quantization_config; "" for the object itself) unless `ok`."""
    if not ok:
        raise ValueError(f"{CONFIG_KEY}{'.' if field else ''}{field}: {message}")


def read_checkpoint_quantization(hf_config: dict[str, Any]) -> Optional[CheckpointQuantization]:
    """The checkpoint's quantization (None: a float checkpoint); ValueError naming the config field for any scheme,
    format or option jaxpaged does not run."""
    config = hf_config.get(CONFIG_KEY)
    if config is None:
        return None
    _require(isinstance(config, dict), "", f"must be an object, got {config!r}")
    method = config.get("quant_method")
    _require(method == QUANT_METHOD, "quant_method",
             f"{method!r} checkpoints are not supported (jaxpaged reads {QUANT_METHOD!r} int8 checkpoints)")
    fmt = config.get("format")
    _require(fmt in _FORMATS, "format", f"{fmt!r} is not supported (int8 checkpoints are one of {_FORMATS})")
    for field in ("kv_cache_scheme", "transform_config", "sparsity_config"):
        _require(not config.get(field), field, f"is not supported yet, got {config.get(field)!r}")
    groups = config.get("config_groups")
    _require(isinstance(groups, dict) and bool(groups), "config_groups",
             f"must name at least one scheme, got {groups!r}")
    schemes = {_read_group(f"config_groups.{name}", group) for name, group in groups.items()}
    _require(len(schemes) == 1, "config_groups",
             f"mixes schemes {sorted(map(str, schemes))}; jaxpaged runs one int8 scheme per model")
    (scheme, strategy, group_size), = schemes
    ignore = config.get("ignore") or []
    _require(isinstance(ignore, list) and all(isinstance(item, str) for item in ignore), "ignore",
             f"must be a list of module names, got {ignore!r}")
    return CheckpointQuantization(scheme, strategy, group_size, tuple(ignore))


def _read_group(field: str, group: Any) -> tuple[str, str, Optional[int]]:
    """(scheme, weight strategy, group size) of one config group."""
    _require(isinstance(group, dict), field, f"must be an object, got {group!r}")
    weights = group.get("weights")
    _require(isinstance(weights, dict), f"{field}.weights", f"must describe the weights, got {weights!r}")
    _check_int8(f"{field}.weights", weights)
    strategy = weights.get("strategy")
    _require(strategy in _STRATEGIES, f"{field}.weights.strategy",
             f"{strategy!r} is not supported (one of {_STRATEGIES})")
    _require(not weights.get("dynamic"), f"{field}.weights.dynamic", "dynamic weight scales are not supported")
    group_size = weights.get("group_size") if strategy == "group" else None
    if strategy == "group":
        _require(isinstance(group_size, int) and group_size > 0, f"{field}.weights.group_size",
                 f"must be a positive int for the group strategy, got {group_size!r}")
    _require(not group.get("output_activations"), f"{field}.output_activations", "output quantization is not supported")
    activations = group.get("input_activations")
    if activations:
        _require(isinstance(activations, dict), f"{field}.input_activations", f"must be an object, got {activations!r}")
        _check_int8(f"{field}.input_activations", activations)
        _require(activations.get("strategy") == "token" and activations.get("dynamic") is True,
                 f"{field}.input_activations",
                 f"only dynamic per-token activations are supported (strategy 'token', dynamic true), got strategy "
                 f"{activations.get('strategy')!r}, dynamic {activations.get('dynamic')!r}")
    return SCHEME_NAMES[bool(activations)], strategy, group_size


def _check_int8(field: str, args: dict[str, Any]) -> None:
    _require(args.get("num_bits") == 8, f"{field}.num_bits", f"only 8 bits are supported, got {args.get('num_bits')!r}")
    _require(args.get("type") == "int", f"{field}.type", f"only 'int' is supported, got {args.get('type')!r}")
    _require(args.get("symmetric") is True, f"{field}.symmetric",
             f"only symmetric quantization is supported (no zero points), got {args.get('symmetric')!r}")


def resolve_scheme(checkpoint: Optional[CheckpointQuantization], requested: Optional[str]) -> Optional[str]:
    """The scheme an engine runs a checkpoint in, given --quantization (`requested`; "compressed-tensors": as the
    checkpoint says): a compressed-tensors checkpoint's own (W8A16 "int8", W8A8 "w8a8"). ValueError naming
    `quantization` when the flag disagrees with the checkpoint."""
    if checkpoint is None:
        if requested == QUANT_METHOD:
            raise ValueError(f"quantization: {QUANT_METHOD!r} needs a checkpoint whose config.json has a "
                             f"{CONFIG_KEY}; this one is a float checkpoint (use 'int8' to quantize it as it loads)")
        return requested
    if requested not in (None, QUANT_METHOD, checkpoint.scheme):
        raise ValueError(f"quantization: {requested!r} disagrees with the checkpoint, which is compressed-tensors "
                         f"{'W8A8' if checkpoint.scheme == 'w8a8' else 'W8A16'} ({checkpoint.scheme!r}); pass "
                         f"{checkpoint.scheme!r}, {QUANT_METHOD!r} or nothing")
    return checkpoint.scheme


def scale_entry_name(weight_name: str) -> str:
    """The tensor holding `weight_name`'s scales ("...q_proj.weight" -> "...q_proj.weight_scale")."""
    return weight_name + "_scale"


def check_int8_entries(entries: dict[str, TensorEntry], checkpoint: CheckpointQuantization) -> None:
    """Every int8 tensor of the checkpoint is a 2-D weight with scales of the strategy's shape, checked from the
    files' headers before any weight is read; ValueError naming the tensor otherwise."""
    for name, entry in entries.items():
        if entry.dtype == "I8":
            _check_int8_entry(entry, entries.get(scale_entry_name(name)), checkpoint)


def _check_int8_entry(weight: TensorEntry, scale: Optional[TensorEntry], checkpoint: CheckpointQuantization,
                      ) -> TensorEntry:
    """`scale`, once `weight` and it have the shapes `checkpoint`'s strategy packs; ValueError naming the tensor."""
    if scale is None:
        raise ValueError(f"checkpoint tensor {weight.name!r} is int8 but {scale_entry_name(weight.name)!r} is missing")
    if len(weight.shape) != 2:
        raise ValueError(f"checkpoint tensor {weight.name!r}: an int8 weight must be 2-D [out, in], got {weight.shape}")
    outer, inner = weight.shape
    if checkpoint.strategy == "group":
        expected = [(outer, math.ceil(inner / (checkpoint.group_size or 1)))]
    elif checkpoint.strategy == "channel":
        expected = [(outer, 1), (outer,)]
    else:
        expected = [(1,), ()]
    if scale.shape not in expected:
        raise ValueError(f"checkpoint tensor {scale.name!r}: {checkpoint.strategy} scales of a {weight.shape} weight"
                         f"{f' in groups of {checkpoint.group_size}' if checkpoint.group_size else ''} must be "
                         f"{expected[0]}, got {scale.shape}")
    return scale


def read_int8_weight(weight: TensorEntry, scale: Optional[TensorEntry],
                     checkpoint: CheckpointQuantization) -> HostInt8:
    """One int8 Linear weight ([out, in] in the file) as jaxpaged's per-output-channel int8: values [in, out] (a
    transposed view of the mapped file for channel and tensor scales) and float32 scales [out]."""
    scale = _check_int8_entry(weight, scale, checkpoint)
    values = open_tensor(weight, quantized=True)
    scales = np.asarray(open_tensor(scale), dtype=np.float32)
    if checkpoint.strategy == "group":
        return requantize_rows(values, scales.reshape(values.shape[0], -1), checkpoint.group_size or 1)
    return HostInt8(values.T, np.broadcast_to(scales.reshape(-1), (values.shape[0],)).astype(np.float32))
