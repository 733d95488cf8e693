"""lm-evaluation-harness accuracy of quantized against unquantized serving: `jaxpaged serve` per scheme (none,
"int8", "w8a8") on the embedded SmolLM2-135M-Instruct, scored by lm-eval's `local-completions` (echo + logprobs
loglikelihoods, as tests/eval/test_lm_eval_harness.py checks against its `hf` backend) on the local
multiple-choice task of mc_task.py (1,004 questions). Reports each scheme's acc and acc_norm with their standard
errors and its accuracy per question family; for a quantized scheme, the paired difference from unquantized over the
same questions with its standard error (paired_difference.py), the questions it lost and gained (per family too),
the answers that changed and the mean |difference| of the choices' loglikelihoods.

    python -m benchmarks.quantization.lm_eval_accuracy [--schemes int8 w8a8] [--dtype float32] [--out FILE.json]

No network: the task's data is written locally and the harness runs with the HF hubs offline.
"""

import argparse
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any, Optional

from benchmarks.json_report import print_json
from benchmarks.quantization.mc_task import TASK_NAME, write_task
from benchmarks.quantization.paired_difference import paired_difference
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.bench.server_process import ServerProcess

SERVER_OPTIONS: dict[str, Any] = dict(max_model_len=512, max_num_seqs=16, max_num_batched_tokens=256)


def _evaluate(server: ServerProcess, model_name: str, tokenizer_dir: pathlib.Path, task_dir: pathlib.Path,
              ) -> dict[str, Any]:
    """lm-eval's results for the task against `server`: {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr",
    "answers" (the argmax choice per question, in order), "correct" (whether that is the answer), "families" (each
    question's family), "loglikelihoods" (per question, per choice)}."""
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.tasks import TaskManager

    results: Any = simple_evaluate(
        model="local-completions", tasks=[TASK_NAME], task_manager=TaskManager(include_path=str(task_dir)),
        model_args=f"base_url={server.base_url}/v1/completions,model={model_name},tokenizer={tokenizer_dir},"
                   "num_concurrent=4,max_retries=1,tokenized_requests=True", log_samples=True)
    scores = results["results"][TASK_NAME]
    samples = sorted(results["samples"][TASK_NAME], key=lambda sample: sample["doc_id"])
    loglikelihoods = [[float(response[0]) for response in sample["filtered_resps"]] for sample in samples]
    answers = [max(range(len(row)), key=row.__getitem__) for row in loglikelihoods]
    return {"acc": scores["acc,none"], "acc_stderr": scores["acc_stderr,none"], "acc_norm": scores["acc_norm,none"],
            "acc_norm_stderr": scores["acc_norm_stderr,none"], "answers": answers,
            "correct": [answer == int(sample["target"]) for answer, sample in zip(answers, samples)],
            "families": [sample["doc"]["family"] for sample in samples], "loglikelihoods": loglikelihoods}


def _by_family(families: list[str], values: list[bool]) -> dict[str, tuple[int, int]]:
    """(how many of `values` are true, how many questions) per family."""
    counts: dict[str, tuple[int, int]] = {}
    for family, value in zip(families, values):
        hits, total = counts.get(family, (0, 0))
        counts[family] = (hits + value, total + 1)
    return counts


def _compare(run: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """A quantized run's figures against the unquantized one's over the same questions."""
    paired = paired_difference(baseline["correct"], run["correct"])
    lost = [b and not r for r, b in zip(run["correct"], baseline["correct"])]
    gained = [r and not b for r, b in zip(run["correct"], baseline["correct"])]
    lost_by, gained_by = _by_family(run["families"], lost), _by_family(run["families"], gained)
    return {
        "paired_difference_points": 100 * paired.difference, "paired_difference_stderr_points":
            100 * paired.difference_stderr, "lost": paired.lost, "gained": paired.gained,
        "flips_by_family": {family: {"lost": lost_by[family][0], "gained": gained_by[family][0]}
                            for family in lost_by if lost_by[family][0] or gained_by[family][0]},
        "answers_changed": sum(a != b for a, b in zip(run["answers"], baseline["answers"])),
        "mean_abs_choice_loglikelihood_difference": statistics.fmean(
            abs(ours - theirs) for row, base in zip(run["loglikelihoods"], baseline["loglikelihoods"])
            for ours, theirs in zip(row, base)),
    }


def measure(schemes: list[Optional[str]], dtype: str, log_dir: pathlib.Path) -> dict[str, Any]:
    """Every figure of one run (see the module docstring)."""
    from jaxpaged.weights.loader import locate_model

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    os.environ.setdefault("HF_DATASETS_CACHE", str(log_dir / "datasets-cache"))
    tokenizer_dir, model_name = locate_model(None)
    task_dir = log_dir / "task"
    write_task(task_dir)
    started = time.time()
    seconds: dict[str, float] = {}
    runs: dict[str, dict[str, Any]] = {}
    for scheme in schemes:
        label = scheme or "unquantized"
        options = SERVER_OPTIONS | {"dtype": dtype} | ({"quantization": scheme} if scheme else {})
        with ServerProcess(None, options, log_dir / f"serve-{label}.log") as server:
            evaluated = time.time()
            runs[label] = _evaluate(server, model_name, tokenizer_dir, task_dir)
            seconds[label] = round(time.time() - evaluated, 1)
    result: dict[str, Any] = {"model": "SmolLM2-135M-Instruct (embedded)", "task": TASK_NAME, "dtype": dtype,
                              "num_questions": len(runs[next(iter(runs))]["answers"]),
                              "machine": describe_machine(machine_info())}
    baseline = runs.get("unquantized")
    for label, run in runs.items():
        summary = {key: run[key] for key in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")}
        summary["acc_by_family"] = {family: round(hits / total, 4) for family, (hits, total) in
                                    _by_family(run["families"], run["correct"]).items()}
        if baseline is not None and run is not baseline:
            summary |= _compare(run, baseline)
        result[label] = summary
    result |= {"load_average": load_average(), "evaluation_seconds": seconds,
               "seconds": round(time.time() - started, 1)}
    return result


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--schemes", nargs="+", default=["int8", "w8a8"], help="compared with unquantized")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jaxpaged-lm-eval-") as scratch:
        result = measure([None, *args.schemes], args.dtype, pathlib.Path(scratch))
    print_json(result, args.out)


if __name__ == "__main__":
    main()
