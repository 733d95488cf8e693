"""Writes tiny compressed-tensors int8 checkpoints with the compressed-tensors library itself (the writer
llm-compressor uses), and their float32 references: the same model with every int8 weight replaced by
weight * weight_scale, as the format defines it."""

import pathlib
import shutil
from typing import Any

import numpy as np

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def weight_args(strategy: str, group_size: int = 32) -> Any:
    """compressed-tensors' QuantizationArgs of symmetric int8 weights per `strategy`."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy, QuantizationType

    return QuantizationArgs(num_bits=8, type=QuantizationType.INT, symmetric=True, dynamic=False,
                            strategy=QuantizationStrategy(strategy),
                            group_size=group_size if strategy == "group" else None)


def write_compressed_checkpoint(directory: pathlib.Path, tokenizer_dir: pathlib.Path, config: dict[str, Any],
                                strategy: str = "channel", activations: bool = False,
                                ignore: tuple[str, ...] = ("lm_head",)) -> pathlib.Path:
    """A seeded random Llama of `config` quantized to int8 (weights per `strategy`; `activations`: W8A8's dynamic
    per-token int8 inputs, else W8A16) and saved by ModelCompressor as vLLM reads it; modules on `ignore` stay
    float."""
    import torch
    import transformers
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        QuantizationStrategy,
        QuantizationType,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    inputs = (QuantizationArgs(num_bits=8, type=QuantizationType.INT, symmetric=True, dynamic=True,
                               strategy=QuantizationStrategy.TOKEN) if activations else None)
    scheme = QuantizationScheme(targets=["Linear"], weights=weight_args(strategy), input_activations=inputs)
    quantization = QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore),
                                      quantization_status=QuantizationStatus.CALIBRATION, format="int-quantized")
    apply_quantization_config(model, quantization, show_progress=False)
    for module in model.modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None or not isinstance(module, torch.nn.Linear):
            continue
        # What llm-compressor's min-max observer feeds calculate_qparams: the range per scale.
        weight = module.weight.detach()
        if strategy == "channel":
            ranges = weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True)
        elif strategy == "group":
            grouped = weight.reshape(weight.shape[0], -1, args.group_size)
            ranges = grouped.amin(dim=2), grouped.amax(dim=2)
        else:
            ranges = weight.amin().reshape(1), weight.amax().reshape(1)
        scale, _ = calculate_qparams(*ranges, args)
        scales: torch.nn.Parameter = module.get_parameter("weight_scale")
        scales.data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="int-quantized")
    compressor.compress_model(model)
    model.save_pretrained(directory)
    compressor.update_config(str(directory))
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, directory / name)
    return directory


def dequantized_weights(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """Every weight of a compressed checkpoint in float32, int8 ones as weight * weight_scale (scales broadcast per
    row, per group of columns or per tensor); no *_scale tensors."""
    from safetensors.numpy import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    weights = {}
    for name, tensor in tensors.items():
        if name.endswith("_scale"):
            continue
        if tensor.dtype != np.int8:
            weights[name] = tensor.astype(np.float32)
            continue
        scale = tensors[name + "_scale"].astype(np.float32)  # [1], [rows, 1] or [rows, groups]
        columns = tensor.shape[1]
        if scale.ndim == 2 and scale.shape[1] > 1:  # one scale per group of columns of a row
            scale = np.repeat(scale, -(-columns // scale.shape[1]), axis=1)[:, :columns]
        weights[name] = tensor.astype(np.float32) * scale
    return weights


def write_dequantized_checkpoint(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """`source`'s compressed checkpoint as a plain float32 HF checkpoint of its dequantized weights."""
    import json

    from safetensors.numpy import save_file

    target.mkdir(parents=True)
    for file in source.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, target / file.name)
    config = json.loads((target / "config.json").read_text())
    del config["quantization_config"]
    (target / "config.json").write_text(json.dumps(config))
    save_file({name: np.ascontiguousarray(value) for name, value in dequantized_weights(source).items()},
              str(target / "model.safetensors"), metadata={"format": "pt"})
    return target
