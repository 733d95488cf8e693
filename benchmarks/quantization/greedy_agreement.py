"""How far quantization (EngineConfig.quantization: "int8" weights, "w8a8" int8 activations too) moves a model's
greedy choices and likelihoods: the unquantized model generates greedily, then every model reads prompt + that
continuation (teacher-forced, one prefill with prompt logprobs). A position agrees when the unquantized model's token
is the quantized model's argmax (its rank is 1); the log-likelihood difference is the quantized model's log-prob of
that token minus the unquantized model's, averaged over every continuation token (negative: the quantized model finds
the text less likely). Also free-running: each quantized model's own greedy continuation against the unquantized one.

    python -m benchmarks.quantization.greedy_agreement [--model PATH] [--num-tokens 64] [--schemes int8 w8a8]
        [--out FILE.json]

Default model: the embedded SmolLM2-135M-Instruct. The unquantized model's own teacher-forced agreement is printed
beside: the prefill path against the decode steps that chose the tokens (1.0 up to near-ties).
"""

import argparse
import statistics
import time
from typing import Any, Optional

from benchmarks.json_report import print_json
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams

PROMPTS = [
    "The capital of France is", "Write a short poem about the sea.", "Explain what a hash table is.",
    "List three uses of copper.", "Once upon a time, in a small village,", "The best way to learn a language is",
    "Photosynthesis is the process by which", "Give me a recipe for pancakes.", "def fibonacci(n):",
    "Summarize the plot of Romeo and Juliet.", "What causes the seasons on Earth?", "The history of the Roman Empire",
    "How do vaccines work?", "Translate 'good morning' into Spanish and French.", "A haiku about autumn leaves:",
    "Why is the sky blue?", "The three laws of thermodynamics are", "Describe a cat to someone who has never seen one.",
    "Tips for a job interview:", "In machine learning, overfitting means",
]
ENGINE_OPTIONS: dict[str, Any] = dict(max_model_len=512, max_num_seqs=32, max_num_batched_tokens=512,
                                      compilation_cache_dir="")


def continuations(llm: LLM, num_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy continuation ids) per prompt."""
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True),
                           use_tqdm=False)
    return [(list(output.prompt_token_ids), list(output.outputs[0].token_ids)) for output in outputs]


def teacher_forced(llm: LLM, pairs: list[tuple[list[int], list[int]]]) -> list[list[tuple[int, float]]]:
    """(rank, log-prob) of each continuation token under `llm` reading prompt + continuation in one prefill."""
    prompts = [{"prompt_token_ids": prompt + continuation} for prompt, continuation in pairs]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    scored = []
    for output, (prompt, continuation) in zip(outputs, pairs):
        positions = output.prompt_logprobs or []
        entries = [positions[len(prompt) + j][token] for j, token in enumerate(continuation)]  # type: ignore
        scored.append([(entry.rank, entry.logprob) for entry in entries])
    return scored


def share(scored: list[list[tuple[int, float]]]) -> float:
    """The share of tokens ranked first."""
    flat = [rank for row in scored for rank, _ in row]
    return sum(rank == 1 for rank in flat) / len(flat)


def token_logprobs(scored: list[list[tuple[int, float]]]) -> list[float]:
    """Every token's log-prob, flat."""
    return [logprob for row in scored for _, logprob in row]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def measure(model: Optional[str], num_tokens: int, dtype: str, schemes: list[str]) -> dict[str, Any]:
    """Every figure of one run (see the module docstring)."""
    started = time.time()
    with LLM(model, dtype=dtype, **ENGINE_OPTIONS) as unquantized:
        pairs = continuations(unquantized, num_tokens)
        reference = teacher_forced(unquantized, pairs)
    reference_logprobs = token_logprobs(reference)
    result: dict[str, Any] = {
        "model": model or "SmolLM2-135M-Instruct (embedded)", "dtype": dtype, "num_prompts": len(PROMPTS),
        "num_tokens": num_tokens, "machine": describe_machine(machine_info()),
        "teacher_forced_agreement_unquantized": share(reference),
        "mean_loglikelihood_per_token_unquantized": statistics.fmean(reference_logprobs),
    }
    for scheme in schemes:
        with LLM(model, dtype=dtype, quantization=scheme, **ENGINE_OPTIONS) as quantized:
            scored = teacher_forced(quantized, pairs)
            own = continuations(quantized, num_tokens)
        differences = [ours - theirs for ours, theirs in zip(token_logprobs(scored), reference_logprobs)]
        prefixes = [common_prefix(ours[1], theirs[1]) for ours, theirs in zip(own, pairs)]
        result[scheme] = {
            "teacher_forced_agreement": share(scored),
            "rank_histogram": histogram(scored),
            "mean_loglikelihood_difference_per_token": statistics.fmean(differences),
            "mean_abs_loglikelihood_difference_per_token": statistics.fmean(abs(d) for d in differences),
            "free_running_identical_sequences": sum(p == num_tokens for p in prefixes),
            "free_running_mean_common_prefix": sum(prefixes) / len(prefixes),
        }
    result |= {"load_average": load_average(), "seconds": round(time.time() - started, 1)}
    return result


def histogram(scored: list[list[tuple[int, float]]]) -> dict[str, int]:
    flat = [rank for row in scored for rank, _ in row]
    return {"1": sum(r == 1 for r in flat), "2": sum(r == 2 for r in flat), "3+": sum(r >= 3 for r in flat)}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--num-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--schemes", nargs="+", default=["int8", "w8a8"], help="quantization schemes to compare")
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    result = measure(args.model, args.num_tokens, args.dtype, args.schemes)
    print_json(result, args.out)


if __name__ == "__main__":
    main()
