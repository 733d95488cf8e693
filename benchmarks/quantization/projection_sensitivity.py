"""Which projection's int8 rounding moves the local multiple-choice task's answers (mc_task.py): the embedded model
with its projections fake-quantized in float32 (int8_weights.quantize_int8 then dequantize_int8: the rounding the
int8 engine computes with, tests/models/test_int8_engine.py), every kind at once ("all") and every kind but one
("all but q_proj", ...), each scored against the float model over the same questions. Scores are lm-eval's
loglikelihood accuracy (the choice whose tokens the model finds likeliest after the question, with lm-eval's
context / continuation split), computed offline by one teacher-forced prefill per choice; "all" reproduces the
int8 serving's figures of lm_eval_accuracy.py up to float32 noise.

    python -m benchmarks.quantization.projection_sensitivity [--leave-out q_proj ...] [--out FILE.json]

A kind whose leave-one-out difference sits well above "all"'s (fewer questions lost) is where int8 costs the task.
No scheme changes: this reads the float checkpoint and writes fake-quantized copies to a scratch directory.
"""

import argparse
import pathlib
import tempfile
import time
from typing import Any, Optional

from benchmarks.json_report import print_json
from benchmarks.quantization.mc_task import questions
from benchmarks.quantization.paired_difference import paired_difference
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.models.int8_weights import QUANTIZED_PROJECTIONS, dequantize_int8, quantize_int8

ENGINE_OPTIONS: dict[str, Any] = dict(dtype="float32", max_model_len=128, max_num_seqs=64,
                                      max_num_batched_tokens=1024, compilation_cache_dir="")


def _pairs(tokenizer: Any, items: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) per question and choice, split as lm-eval's loglikelihood requests are: the
    whole string tokenized, the context's tokens cut off its front."""
    pairs = []
    for item in items:
        context = tokenizer(item["question"]).input_ids
        for choice in item["choices"]:
            whole = tokenizer(item["question"] + choice).input_ids
            pairs.append((context, whole[len(context):]))
    return pairs


def _correct(model_dir: pathlib.Path, items: list[dict[str, Any]]) -> list[bool]:
    """Whether the model at `model_dir` gives each question's answer the highest loglikelihood."""
    from jaxpaged.llm import LLM
    from jaxpaged.sampling.params import SamplingParams

    with LLM(str(model_dir), **ENGINE_OPTIONS) as llm:
        pairs = _pairs(llm.get_tokenizer(), items)
        prompts = [{"prompt_token_ids": context + continuation} for context, continuation in pairs]
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0),
                               use_tqdm=False)
    scores = []
    for output, (context, continuation) in zip(outputs, pairs):
        positions = output.prompt_logprobs or []
        scores.append(sum(positions[len(context) + j][token].logprob  # type: ignore[index]
                          for j, token in enumerate(continuation)))
    num_choices = [len(item["choices"]) for item in items]
    starts = [sum(num_choices[:i]) for i in range(len(items))]
    return [max(range(n), key=lambda k, s=s: scores[s + k]) == item["answer"]
            for item, n, s in zip(items, num_choices, starts)]


def _fake_quantized(source: pathlib.Path, target: pathlib.Path, kinds: tuple[str, ...]) -> pathlib.Path:
    """`source` (a converted checkpoint) with the projections `kinds` replaced by their int8 round trip."""
    from transformers import AutoTokenizer

    from jaxpaged.weights.converted_store import load_converted, save_converted

    hf_config, params, model_name = load_converted(source)
    for kind in kinds:
        values, scale = quantize_int8(params[f"layers.{kind}"])
        params[f"layers.{kind}"] = dequantize_int8(values, scale)
    save_converted(target, hf_config, params, AutoTokenizer.from_pretrained(str(source)), model_name)
    return target


def measure(leave_out: list[str], scratch: pathlib.Path) -> dict[str, Any]:
    """Every figure of one run (see the module docstring)."""
    from jaxpaged.weights.loader import locate_model

    unknown = [kind for kind in leave_out if kind not in QUANTIZED_PROJECTIONS]
    if unknown:
        raise ValueError(f"leave_out: {unknown} are not projections ({', '.join(QUANTIZED_PROJECTIONS)})")
    started = time.time()
    source, _ = locate_model(None)
    items = questions()
    families = [item["family"] for item in items]
    reference = _correct(source, items)
    result: dict[str, Any] = {"model": "SmolLM2-135M-Instruct (embedded), float32", "num_questions": len(items),
                              "machine": describe_machine(machine_info()),
                              "float_accuracy": sum(reference) / len(items)}
    configs = {"all": QUANTIZED_PROJECTIONS} | {
        f"all but {kind}": tuple(k for k in QUANTIZED_PROJECTIONS if k != kind) for kind in leave_out}
    for label, kinds in configs.items():
        model_dir = _fake_quantized(source, scratch / label.replace(" ", "_"), kinds)
        correct = _correct(model_dir, items)
        paired = paired_difference(reference, correct)
        flips: dict[str, list[int]] = {}
        for family, ours, theirs in zip(families, correct, reference):
            if ours != theirs:
                flips.setdefault(family, [0, 0])[int(ours)] += 1  # [lost, gained]
        result[label] = {"accuracy": paired.candidate_accuracy, "paired_difference_points": 100 * paired.difference,
                         "paired_difference_stderr_points": 100 * paired.difference_stderr, "lost": paired.lost,
                         "gained": paired.gained, "flips_by_family": {
                             family: {"lost": lost, "gained": gained} for family, (lost, gained) in flips.items()}}
    result |= {"load_average": load_average(), "seconds": round(time.time() - started, 1)}
    return result


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--leave-out", nargs="+", default=list(QUANTIZED_PROJECTIONS),
                        help="projection kinds to leave in float, one at a time")
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jaxpaged-projection-sensitivity-") as scratch:
        result = measure(args.leave_out, pathlib.Path(scratch))
    print_json(result, args.out)


if __name__ == "__main__":
    main()
