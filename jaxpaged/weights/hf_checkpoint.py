"""Load an HF transformers checkpoint directory (config.json + one or many .safetensors) without torch, lazily and
in the checkpoint's own dtype (or a compressed-tensors int8 checkpoint as int8: weights/compressed_tensors.py)."""

import json
import logging
import pathlib
from typing import Optional, cast

import numpy as np

from jaxpaged.models.int8_weights import HostInt8, dequantize_int8
from jaxpaged.models.registry import architecture_of, resolve
from jaxpaged.models.weight_names import AssembledTensor
from jaxpaged.weights import compressed_tensors
from jaxpaged.weights.mxfp4 import BLOCKS_SUFFIX, SCALES_SUFFIX, Mxfp4Parameter, is_mxfp4_checkpoint
from jaxpaged.weights.param_names import stack_layers
from jaxpaged.weights.safetensors_file import TensorEntry, open_tensor, read_header

logger = logging.getLogger(__name__)

_INDEX_FILE = "model.safetensors.index.json"


def is_hf_checkpoint(path: pathlib.Path) -> bool:
    """A directory with config.json and at least one .safetensors file."""
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def checkpoint_files(path: pathlib.Path) -> list[pathlib.Path]:
    """The weight files: the ones model.safetensors.index.json names, else every top-level .safetensors file.

    The index matters where a directory holds more than one copy of the weights (Mistral repos ship
    consolidated.safetensors beside the HF shards, under other tensor names); it also turns a missing shard into
    a clear error rather than a "tensor is missing" one.
    """
    index = path / _INDEX_FILE
    if not index.is_file():
        return sorted(path.glob("*.safetensors"))
    names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    missing = [name for name in names if not (path / name).is_file()]
    if missing:
        raise ValueError(f"checkpoint {path}: {_INDEX_FILE} lists {', '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not there (an incomplete download?)")
    return [path / name for name in names]


def load_hf_checkpoint(path: pathlib.Path, quantization: Optional[str] = None,
                       ) -> tuple[dict, dict[str, np.ndarray], Optional[str]]:
    """Return (HF config dict, jaxpaged params in the checkpoint's own dtype, the scheme the projections are in).

    `quantization` (EngineConfig.quantization): "int8" or "w8a8" quantizes a float checkpoint's projections as they
    load; a compressed-tensors checkpoint's own scheme is checked against it before any weight is read, and its int8
    projections are taken as they are (compressed_tensors.resolve_scheme). Tensors are memory-mapped: each layer's
    is copied (or quantized) once into its stacked parameter, and global weights (embedding, final norm, lm_head)
    stay mapped views of the file until the runner places them.
    """
    hf_config = json.loads((path / "config.json").read_text())
    # gpt-oss's MXFP4 experts are dequantized as they load (weights/mxfp4.py): a float checkpoint to the engine.
    mxfp4 = is_mxfp4_checkpoint(hf_config)
    checkpoint = None if mxfp4 else compressed_tensors.read_checkpoint_quantization(hf_config)
    scheme = compressed_tensors.resolve_scheme(checkpoint, quantization)
    architecture = architecture_of(hf_config)
    entry = resolve(architecture)
    cfg = entry.read_config(hf_config, architecture)
    entries: dict[str, TensorEntry] = {}
    for file in checkpoint_files(path):
        entries.update(read_header(file))
    if checkpoint is not None:
        compressed_tensors.check_int8_entries(entries, checkpoint)
    names = entry.hf_names
    file_names = names.mapper.map_names(entries)  # {the family's spelling: the file's}
    notes: set[str] = set()

    def lookup(full_name: str) -> Optional[np.ndarray]:
        """A tensor as stored (a mapped view), for an AssembledTensor; None when absent."""
        hf_name = file_names.get(full_name)
        if hf_name is None:
            return mxfp4_parameter(full_name) if mxfp4 else None
        if entries[hf_name].dtype == "I8":
            raise ValueError(f"checkpoint {path}: tensor {full_name!r} is int8; this parameter is read from "
                             "float tensors only")
        return open_tensor(entries[hf_name])

    def mxfp4_parameter(full_name: str) -> Optional[np.ndarray]:
        """`full_name` stored as MXFP4 blocks and scales, dequantized as its reader takes columns (gate_up_proj's
        gate and up halves each once); None when there are no such blocks."""
        blocks, scales = (file_names.get(full_name + suffix) for suffix in (BLOCKS_SUFFIX, SCALES_SUFFIX))
        if blocks is None:
            return None
        if scales is None:
            raise ValueError(f"tensor {full_name + SCALES_SUFFIX!r} is missing (its blocks are there)")
        # Array-like (shape, ndim, take, __array__): what expert_tensors.Fused reads of a fused expert tensor.
        return cast(np.ndarray, Mxfp4Parameter(open_tensor(entries[blocks], quantized=True),
                                               open_tensor(entries[scales], quantized=True), full_name))

    def fetch(name: str, layer: Optional[int]) -> "np.ndarray | HostInt8":
        assembled = names.layer.get(name) if layer is not None else None
        # A MoE family's experts, assembled from several tensors (models/expert_tensors.py).
        if isinstance(assembled, AssembledTensor) and layer is not None:
            try:
                return assembled.build(lookup, names.layer_prefix.format(layer=layer), layer, cfg)
            except ValueError as error:
                raise ValueError(f"checkpoint {path}: {error}") from None
        tensor = names.tensor(name, layer)
        hf_name, transpose = file_names.get(tensor.name), tensor.transpose
        if hf_name is None:
            raise ValueError(f"checkpoint {path}: tensor {tensor.name!r} is missing")
        stored = entries[hf_name]
        if checkpoint is not None and stored.dtype == "I8":
            int8 = compressed_tensors.read_int8_weight(
                stored, entries.get(compressed_tensors.scale_entry_name(hf_name)), checkpoint)
            if layer is not None:
                return int8
            notes.add(f"{hf_name} dequantized (the engine keeps it in the model dtype)")
            dequantized = dequantize_int8(int8.values, int8.scale)  # [in, out]: the file's rows are its columns
            return dequantized if transpose else dequantized.T
        value = open_tensor(stored)
        if checkpoint is not None and layer is not None and transpose:
            notes.add("float projections (the checkpoint's ignore list) quantized per channel as they load")
        return value.T if transpose else value

    params = stack_layers(cfg, fetch, scheme)
    if checkpoint is not None:
        logger.info("compressed-tensors %s checkpoint (%s scales%s): running %s%s", checkpoint.scheme.upper(),
                    checkpoint.strategy, "" if checkpoint.strategy != "group" else
                    f" of {checkpoint.group_size}, requantized per output channel", scheme,
                    "".join(f"; {note}" for note in sorted(notes)))
    return hf_config, params, scheme
