"""A draft model cut from a target: its first N layers (all by default) with its embedding, final norm and head, the
projections optionally int8 (a quarter of float32's bytes to read per step), the same tokenizer.

    python -m benchmarks.speculative.truncated_draft --out /tmp/smollm2-int8 [--layers N] [--quantization int8|w8a8]
                                                      [--model PATH]

(--model: the target, default the embedded SmolLM2-135M-Instruct.) The result is a jaxpaged converted checkpoint,
loadable as `speculative_config={"method": "draft_model", "model": OUT}`. Early layers plus the shared head
predict the next token far worse than the whole model (no training fixes them up); the whole model in int8
agrees with its float self on most greedy tokens. Either is free to build, shares the tokenizer by construction,
and its proposals are exactly checked by the target like any other.
"""

import argparse
import pathlib
from typing import Optional


def write_truncated_draft(model: Optional[str], num_layers: Optional[int], out: pathlib.Path,
                          quantization: Optional[str] = None) -> pathlib.Path:
    """Write the first `num_layers` layers (None: all) of `model` (None: the embedded model) and its global weights to
    `out`, the projections quantized by `quantization` ("int8", "w8a8" or None)."""
    from jaxpaged.models.int8_weights import quantize_params
    from jaxpaged.weights.converted_store import is_converted_checkpoint, save_converted
    from jaxpaged.weights.generation_config import read_generation_config
    from jaxpaged.weights.loader import load_model
    from jaxpaged.weights.tokenizer_source import load_tokenizer

    loaded = load_model(model)
    total = loaded.config.num_layers
    num_layers = total if num_layers is None else num_layers
    if not 1 <= num_layers <= total:
        raise ValueError(f"layers: must be in [1, {total}] for {loaded.name}, got {num_layers}")
    if is_converted_checkpoint(out):
        raise ValueError(f"out: {out} already holds a checkpoint")
    # Stacked parameters carry the layer on their leading axis (weights/param_names.py).
    params = quantize_params({name: value[:num_layers] if name.startswith("layers.") else value
                              for name, value in loaded.params.items()}, quantization)
    hf_config = {**loaded.hf_config, "num_hidden_layers": num_layers}
    save_converted(out, hf_config, params, load_tokenizer(loaded.tokenizer_dir),
                   _draft_name(loaded.name, num_layers, quantization),
                   read_generation_config(loaded.tokenizer_dir) or None, quantization)
    return out


def _draft_name(name: str, num_layers: int, quantization: Optional[str]) -> str:
    return f"{name}-{num_layers}-layers" + (f"-{quantization}" if quantization else "")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="the target (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--layers", type=int, default=None, help="layers kept (default: all)")
    parser.add_argument("--quantization", choices=["int8", "w8a8"], default=None,
                        help="the projections in int8 (w8a8: the draft also quantizes its activations)")
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    print(write_truncated_draft(args.model, args.layers, args.out, args.quantization))


if __name__ == "__main__":
    main()
