"""A PEFT LoRA adapter read from its directory (adapter_config.json + adapter_model.safetensors) and checked
against the base model: per target projection, A [layers, rank, in] and B [layers, out, rank] with the scaling
(lora_alpha / r, or rsLoRA's lora_alpha / sqrt(r)) folded into B, so a projection's output gains x @ A.T @ B.T.

Every problem is a ValueError naming the adapter and the field (or tensor) at fault, raised before anything is
loaded anywhere.
"""

import dataclasses
import hashlib
import json
import math
import pathlib
import re

import numpy as np
from jaxtyping import Float

from jaxpaged.lora.request import LoRARequest
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.weights.safetensors_file import open_tensor, read_header

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
SUPPORTED_TARGETS = ATTENTION_TARGETS + MLP_TARGETS
"""The projections an adapter may adapt: the decoder's attention and gated-MLP matmuls."""

_TENSOR_NAME = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight")
"""PEFT's tensor names: base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (an adapter-name infix
such as .default. is allowed)."""


@dataclasses.dataclass(frozen=True)
class PeftAdapter:
    """One adapter's weights, in float32 on the host, in the layout the device slots take."""

    request: LoRARequest
    rank: int
    scaling: float
    """lora_alpha / r (lora_alpha / sqrt(r) for rsLoRA): already folded into `weights`' B."""
    weights: dict[str, tuple[Float[np.ndarray, "layers rank inner"], Float[np.ndarray, "layers outer rank"]]]
    """Target projection name -> (A, scaled B); layers without tensors of a target hold zeros."""
    fingerprint: str = ""
    """A digest of the weights as served (scaling folded in): it joins the prefix-cache keys, so a persisted KV
    block (the disk tier) is only ever hit by an adapter of the same content, whatever ids a restart hands out."""

    @property
    def nbytes(self) -> int:
        """Host bytes of the weights."""
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def projection_dims(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection an adapter may target, from the model's layer shapes."""
    shapes = cfg.layer_shapes()
    return {name: (shapes[name][0], shapes[name][1]) for name in SUPPORTED_TARGETS if name in shapes}


def read_peft_adapter(request: LoRARequest, cfg: ModelConfig, max_lora_rank: int) -> PeftAdapter:
    """The adapter of `request` read and checked against the base model `cfg` and the slot rank."""
    directory = pathlib.Path(request.lora_path)
    where = f"LoRA adapter {request.lora_name!r} ({directory})"
    config = _read_config(directory, where)
    rank, alpha, targets = _checked_config(config, where, cfg, max_lora_rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights_file = directory / WEIGHTS_FILE
    if not weights_file.is_file():
        raise ValueError(f"{where}: lora_path: no {WEIGHTS_FILE} in the directory (PEFT's .bin files are not read)")
    try:
        entries = read_header(weights_file)
    except (OSError, ValueError) as error:
        raise ValueError(f"{where}: {WEIGHTS_FILE}: {error}") from error
    dims = projection_dims(cfg)
    weights = {name: (np.zeros((cfg.num_layers, rank, dims[name][0]), np.float32),
                      np.zeros((cfg.num_layers, dims[name][1], rank), np.float32)) for name in targets}
    for tensor_name, entry in entries.items():
        match = _TENSOR_NAME.fullmatch(tensor_name)
        if match is None:
            raise ValueError(f"{where}: {WEIGHTS_FILE}: tensor {tensor_name!r} is not a LoRA A/B weight of a decoder "
                             f"projection (embedding, lm_head and modules_to_save tensors are not supported)")
        layer, module, which = int(match.group(1)), match.group(2), match.group(3)
        if module not in targets:
            raise ValueError(f"{where}: {WEIGHTS_FILE}: tensor {tensor_name!r} adapts {module!r}, which is not "
                             f"in target_modules {sorted(targets)}")
        if layer >= cfg.num_layers:
            raise ValueError(f"{where}: {WEIGHTS_FILE}: tensor {tensor_name!r} names layer {layer}; the base model "
                             f"has {cfg.num_layers}")
        inner, outer = dims[module]
        expected = (rank, inner) if which == "A" else (outer, rank)
        if tuple(entry.shape) != expected:
            raise ValueError(f"{where}: {WEIGHTS_FILE}: tensor {tensor_name!r} has shape {tuple(entry.shape)}, "
                             f"expected {expected} (r={rank}, {module} is {inner} -> {outer} in the base model)")
        try:
            values = np.asarray(open_tensor(entry), np.float32)
        except ValueError as error:
            raise ValueError(f"{where}: {WEIGHTS_FILE}: {error}") from error
        a, b = weights[module]
        if which == "A":
            a[layer] = values
        else:
            b[layer] = values * scaling
    digest = hashlib.sha256()
    for name in sorted(weights):
        a, b = weights[name]
        digest.update(name.encode() + a.tobytes() + b.tobytes())
    return PeftAdapter(request, rank, scaling, weights, digest.hexdigest()[:32])


def _read_config(directory: pathlib.Path, where: str) -> dict:
    if not directory.is_dir():
        raise ValueError(f"{where}: lora_path: not a directory")
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"{where}: lora_path: no {CONFIG_FILE} in the directory")
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{where}: {CONFIG_FILE}: not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{where}: {CONFIG_FILE}: must hold a JSON object")
    return config


def _checked_config(config: dict, where: str, cfg: ModelConfig, max_lora_rank: int) -> tuple[int, float, set[str]]:
    """(r, lora_alpha, the target projections) of a PEFT config, or ValueError naming the field."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: peft_type: only LORA adapters are served, got {config.get('peft_type')!r}")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"{where}: r: must be a positive int, got {rank!r}")
    if rank > max_lora_rank:
        raise ValueError(f"{where}: r: {rank} is above max_lora_rank ({max_lora_rank}); raise --max-lora-rank")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise ValueError(f"{where}: lora_alpha: must be a number, got {alpha!r}")
    for field, ok in (("use_dora", not config.get("use_dora")), ("bias", config.get("bias", "none") == "none"),
                      ("modules_to_save", not config.get("modules_to_save")),
                      ("rank_pattern", not config.get("rank_pattern")),
                      ("alpha_pattern", not config.get("alpha_pattern")),
                      ("layers_to_transform", config.get("layers_to_transform") is None)):
        if not ok:
            raise ValueError(f"{where}: {field}: {config.get(field)!r} is not supported")
    return rank, float(alpha), _targets(config.get("target_modules"), where, cfg)


def _targets(target_modules: object, where: str, cfg: ModelConfig) -> set[str]:
    supported = set(projection_dims(cfg))
    if target_modules == "all-linear":
        return supported
    if isinstance(target_modules, str):  # PEFT: a regex over module paths
        pattern = re.compile(target_modules)
        found = {name for name in supported if pattern.fullmatch(f"model.layers.0.self_attn.{name}")
                 or pattern.fullmatch(f"model.layers.0.mlp.{name}") or pattern.fullmatch(name)}
        if not found:
            raise ValueError(f"{where}: target_modules: {target_modules!r} matches none of {sorted(supported)}")
        return found
    if not isinstance(target_modules, list) or not target_modules or not all(
            isinstance(name, str) for name in target_modules):
        raise ValueError(f"{where}: target_modules: must be a non-empty list of module names, got {target_modules!r}")
    unknown = sorted(set(target_modules) - supported)
    if unknown:
        raise ValueError(f"{where}: target_modules: {unknown} cannot be adapted; supported: {sorted(supported)}")
    return set(target_modules)
