"""What loading a Q8_0 GGUF as per-channel int8 costs (jaxpaged/weights/gguf_checkpoint.py requantizes each
32-value block's scale to one scale per output channel): the embedded model's projections are re-encoded as Q8_0 by
the gguf package, then

- weights: the requantized int8 against the gguf package's own Q8_0 dequantization, as a relative error
  ||requantized - Q8_0|| / ||Q8_0|| over every projection, beside Q8_0's own error against the float weights it
  encodes, and the share of weights the second rounding moves;
- tokens: the engine on the Q8_0 GGUF (int8, requantized) against the engine on a float32 GGUF holding exactly Q8_0's
  dequantized weights (Q8_0 as llama.cpp computes it, in float): greedy_agreement's teacher-forced argmax agreement,
  mean log-likelihood difference per token and free-running common prefixes.

    python -m benchmarks.quantization.q8_0_requantization [--num-tokens 64] [--out FILE.json]

Works in a temporary directory (the GGUFs and their conversion caches); nothing is downloaded.
"""

import argparse
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any, Optional

import gguf
import numpy as np

from benchmarks.json_report import print_json
from benchmarks.quantization.greedy_agreement import (
    ENGINE_OPTIONS,
    common_prefix,
    continuations,
    share,
    teacher_forced,
    token_logprobs,
)
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.models.int8_weights import dequantize_int8, requantize_rows
from jaxpaged.weights.default_model import default_model_path
from jaxpaged.weights.gguf_checkpoint import q8_0_rows

_PROJECTIONS = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                "ffn_up.weight", "ffn_down.weight")
Q8_0 = gguf.GGMLQuantizationType.Q8_0


def _is_projection(name: str) -> bool:
    return name.startswith("blk.") and name.split(".", 2)[2] in _PROJECTIONS


def recode(source: pathlib.Path, target: pathlib.Path, as_q8_0: bool) -> dict[str, float]:
    """`source` with every layer projection re-encoded as Q8_0 (`as_q8_0`) or as float32 holding Q8_0's dequantized
    values; other tensors and every metadata field as they are. Returns weight-level figures (Q8_0 only)."""
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8"))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type)
    sums = {"requantized_vs_q8_0": 0.0, "q8_0_vs_float": 0.0, "q8_0": 0.0, "moved": 0, "weights": 0}
    for tensor in reader.tensors:
        if not _is_projection(tensor.name):
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        weight = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        encoded = gguf.quants.quantize(weight, Q8_0)
        q8_0 = np.asarray(gguf.quants.dequantize(encoded, Q8_0), np.float32)
        if as_q8_0:
            writer.add_tensor(tensor.name, encoded, raw_dtype=Q8_0)
            values, scales = q8_0_rows(encoded)
            requantized = dequantize_int8(*requantize_rows(values, scales, 32)).T
            sums["requantized_vs_q8_0"] += float(np.sum((requantized - q8_0) ** 2))
            sums["q8_0_vs_float"] += float(np.sum((q8_0 - weight) ** 2))
            sums["q8_0"] += float(np.sum(q8_0 ** 2))
            sums["moved"] += int(np.sum(requantized != q8_0))
            sums["weights"] += q8_0.size
        else:
            writer.add_tensor(tensor.name, q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if not as_q8_0:
        return {}
    return {"relative_error_requantized_vs_q8_0": (sums["requantized_vs_q8_0"] / sums["q8_0"]) ** 0.5,
            "relative_error_q8_0_vs_float": (sums["q8_0_vs_float"] / sums["q8_0"]) ** 0.5,
            "share_of_weights_moved_by_requantization": sums["moved"] / sums["weights"]}


def measure(num_tokens: int, scratch: pathlib.Path) -> dict[str, Any]:
    """Every figure of one run (see the module docstring)."""
    from jaxpaged.llm import LLM

    os.environ["XDG_CACHE_HOME"] = str(scratch / "cache")  # the GGUFs' conversion caches stay in scratch
    started = time.time()
    source = default_model_path()
    q8_0_path, float_path = scratch / "model.Q8_0.gguf", scratch / "model.Q8_0-as-F32.gguf"
    weights = recode(source, q8_0_path, as_q8_0=True)
    recode(source, float_path, as_q8_0=False)
    with LLM(str(float_path), dtype="float32", **ENGINE_OPTIONS) as reference:
        pairs = continuations(reference, num_tokens)
        expected = teacher_forced(reference, pairs)
    with LLM(str(q8_0_path), dtype="float32", **ENGINE_OPTIONS) as requantized:
        assert requantized.engine.runner.plan.quantization == "int8"
        scored = teacher_forced(requantized, pairs)
        own = continuations(requantized, num_tokens)
    differences = [ours - theirs for ours, theirs in zip(token_logprobs(scored), token_logprobs(expected))]
    prefixes = [common_prefix(ours[1], theirs[1]) for ours, theirs in zip(own, pairs)]
    return {"model": "SmolLM2-135M-Instruct (embedded), projections re-encoded as Q8_0", "num_tokens": num_tokens,
            "machine": describe_machine(machine_info()), **weights,
            "teacher_forced_agreement": share(scored),
            "mean_loglikelihood_difference_per_token": statistics.fmean(differences),
            "mean_abs_loglikelihood_difference_per_token": statistics.fmean(abs(d) for d in differences),
            "free_running_identical_sequences": sum(p == num_tokens for p in prefixes),
            "free_running_mean_common_prefix": sum(prefixes) / len(prefixes),
            "load_average": load_average(), "seconds": round(time.time() - started, 1)}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--num-tokens", type=int, default=64)
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jaxpaged-q8_0-") as scratch:
        result = measure(args.num_tokens, pathlib.Path(scratch))
    print_json(result, args.out)


if __name__ == "__main__":
    main()
