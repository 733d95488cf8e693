"""Load a GGUF file (llama.cpp's format) with the gguf package: metadata -> HF-style config, tensors dequantized to
float32, except a file whose projections are all Q8_0: those stay int8 (models/int8_weights.py).

Q8_0 stores each row in blocks of 32 int8 values with one float16 scale per block. jaxpaged's int8 matmuls (XLA's dot
with the scales on its output, the native CPU int8 panels) take one scale per output channel, so each Q8_0 layer is
requantized per channel as it loads (requantize_rows: the column scale is the row's largest block scale, so the
blocks that set it keep their values exactly and the others are rounded once more). Against keeping the block scales
(a scale per 32 inputs inside every kernel's inner loop), this keeps one int8 format and every kernel as it is, at
a measured cost of agreement (docs/performance.md, "int8 weights").
"""

import logging
import pathlib
import subprocess
import sys
from typing import Any, Optional

import gguf
import numpy as np

from jaxpaged.models.int8_weights import QUANTIZED_PROJECTIONS, HostInt8, requantize_rows
from jaxpaged.models.model_entry import GgufFormat
from jaxpaged.models.registry import resolve_gguf
from jaxpaged.weights.param_names import stack_layers

logger = logging.getLogger(__name__)

_Q8_0_BLOCK = 32
"""Values per Q8_0 block; a block is its float16 scale (2 bytes) then the 32 int8 values."""


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.parts[field.data[0]]
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8")
    return value.item() if value.size == 1 else value.tolist()


def gguf_hf_config(reader: gguf.GGUFReader) -> dict:
    """The HF config.json equivalent of the file's metadata."""
    arch = _field(reader, "general.architecture")
    entry, _ = resolve_gguf(arch)
    names = {t.name for t in reader.tensors}
    num_heads = _field(reader, f"{arch}.attention.head_count")
    config = {
        "architectures": [entry.architecture],
        "model_type": arch,
        "vocab_size": _field(reader, f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": _field(reader, f"{arch}.embedding_length"),
        "intermediate_size": _field(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _field(reader, f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": _field(reader, f"{arch}.attention.head_count_kv", num_heads),
        "rms_norm_eps": _field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": _field(reader, f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": _field(reader, f"{arch}.context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    key_length = _field(reader, f"{arch}.attention.key_length")
    if key_length:
        config["head_dim"] = key_length
    if "rope_freqs.weight" in names:
        raise ValueError("GGUF with rope_freqs (llama3 rope scaling) is not supported yet; use the HF checkpoint")
    return config


def _unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (it interleaves each head's rotary pairs) to HF's rotate-half order."""
    out_dim = weight.shape[0]
    half = out_dim // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def keeps_int8(reader: gguf.GGUFReader, layout: GgufFormat, num_layers: int) -> bool:
    """Whether every layer projection of the file (`layout` names them) is Q8_0 (then they load as int8, not
    float32)."""
    types = {tensor.name: tensor.tensor_type for tensor in reader.tensors}
    names = [layout.names.tensor(name, layer).name for name in QUANTIZED_PROJECTIONS for layer in range(num_layers)]
    projections = [types[name] for name in names if name in types]
    return bool(projections) and all(kind == gguf.GGMLQuantizationType.Q8_0 for kind in projections)


def q8_0_rows(encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 matrix's (int8 values [rows, columns], float32 block scales [rows, columns / 32]), read from its
    encoded bytes ([rows, blocks * 34] uint8, as a GGUF reader's tensor.data holds them) as they are (no float32
    copy of the values)."""
    data = np.asarray(encoded)
    blocks = data.reshape(data.shape[0], -1, 2 + _Q8_0_BLOCK)
    scales = blocks[..., :2].view(np.float16)[..., 0].astype(np.float32)
    return blocks[..., 2:].view(np.int8).reshape(data.shape[0], -1), scales


def load_gguf_checkpoint(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray], Optional[str]]:
    """Return (HF config dict, jaxpaged params, the projections' scheme): float32 numpy arrays, dequantized, or, when
    every projection is Q8_0 (keeps_int8), the projections as int8 with per-channel scales ("int8")."""
    reader = gguf.GGUFReader(str(path))
    hf_config = gguf_hf_config(reader)
    entry, layout = resolve_gguf(hf_config["model_type"])
    cfg = entry.read_config(hf_config, entry.architecture)
    tensors = {t.name: t for t in reader.tensors}
    scheme = "int8" if keeps_int8(reader, layout, cfg.num_layers) else None

    def unpermuted(name: str, rows: np.ndarray) -> np.ndarray:
        """`rows` (a [out, ...] array of q_proj's or k_proj's output rows) in HF's order."""
        if layout.unpermutes_rope and name == "q_proj":
            return _unpermute_rope_rows(rows, cfg.num_q_heads)
        if layout.unpermutes_rope and name == "k_proj":
            return _unpermute_rope_rows(rows, cfg.num_kv_heads)
        return rows

    def fetch(name: str, layer: Optional[int]) -> "np.ndarray | HostInt8":
        stored = layout.names.tensor(name, layer)
        if stored.name not in tensors:
            raise ValueError(f"GGUF {path}: tensor {stored.name!r} is missing")
        tensor = tensors[stored.name]
        if scheme is not None and layer is not None and name in QUANTIZED_PROJECTIONS:
            values, scales = q8_0_rows(tensor.data)  # NOTE: a row permutation commutes with per-row blocks
            return requantize_rows(unpermuted(name, values), unpermuted(name, scales), _Q8_0_BLOCK)
        # GGUF stores a [out, in] matrix as rows of `in` elements, like torch's Linear.weight.
        value = unpermuted(name, np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32))
        return value.T if stored.transpose else value

    params = stack_layers(cfg, fetch, scheme)
    if scheme is not None:
        logger.info("GGUF %s: Q8_0 projections kept quantized (quantization %r implied), requantized per output "
                    "channel", path.name, scheme)
    return hf_config, params, scheme


def convert_gguf_tokenizer(path: pathlib.Path, out_dir: pathlib.Path) -> None:
    """Write the GGUF's tokenizer as HF tokenizer files into out_dir.

    Runs once in a child process (jaxpaged.weights.gguf_tokenizer, torch-free), so transformers' converters and
    their vocabulary tables never stay in the engine process; the result is cached with the converted weights.
    """
    subprocess.run([sys.executable, "-m", "jaxpaged.weights.gguf_tokenizer", str(path), str(out_dir)],
                   check=True, stdout=subprocess.DEVNULL)
