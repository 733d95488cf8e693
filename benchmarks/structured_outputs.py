"""What structured outputs cost: one batch where half the requests follow a JSON schema, against the same batch
with none, on the embedded model (runs alternate, medians of the repeats).

Reports TPOT (time per output token after the first) of the constrained half, of the unconstrained half, and of
the all-unconstrained batch, and whole-batch output tokens/s. Targets (issue 16): the constrained half within 10%
of unconstrained TPOT; the unconstrained half unaffected.

    python -m benchmarks.structured_outputs [--num-requests 32] [--max-tokens 64] [--repeats 3]
"""

import argparse
import statistics
import time

from jaxpaged.bench.machine_info import describe_machine, machine_info
from jaxpaged.llm import LLM
from jaxpaged.outputs import RequestOutput
from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "minLength": 1, "maxLength": 40},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 5}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}


def tpot_ms(output: RequestOutput) -> float:
    completion, metrics = output.outputs[0], output.metrics
    assert metrics.first_token_time is not None and metrics.finish_time is not None
    return 1e3 * (metrics.finish_time - metrics.first_token_time) / max(1, len(completion.token_ids) - 1)


def main() -> None:
    assert __doc__ is not None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    llm = LLM(None, max_num_seqs=args.num_requests, max_model_len=512, max_num_batched_tokens=512,
              dtype="float32", compilation_cache_dir="")
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Invent person number {i}: name, age, "
                                               "city and hobbies, as JSON."}], tokenize=False,
                                             add_generation_prompt=True) for i in range(args.num_requests)]
    free = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    schema = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(json=PERSON))
    half = args.num_requests // 2
    runs = {"none": [free] * args.num_requests, "half": [schema] * half + [free] * (args.num_requests - half)}
    figures: dict[str, list[float]] = {key: [] for key in ("none", "half_constrained", "half_free",
                                                           "tps_none", "tps_half")}
    llm.generate(prompts, runs["half"], use_tqdm=False)  # warm the grammar path (llguidance's tokenizer view)
    compilations = llm.engine.get_stats().num_compilations
    for _ in range(args.repeats):
        for name, params in runs.items():
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            figures[f"tps_{name}"].append(sum(len(o.outputs[0].token_ids) for o in outputs) / seconds)
            if name == "none":
                figures["none"].append(statistics.median(tpot_ms(o) for o in outputs))
            else:
                figures["half_constrained"].append(statistics.median(tpot_ms(o) for o in outputs[:half]))
                figures["half_free"].append(statistics.median(tpot_ms(o) for o in outputs[half:]))
    med = {key: statistics.median(values) for key, values in figures.items()}
    print(f"structured outputs: {args.num_requests} requests, {args.max_tokens} output tokens, {args.repeats} "
          f"repeats, embedded SmolLM2-135M float32, {describe_machine(machine_info())}")
    print("| batch | TPOT p50 ms (median of repeats) | output tok/s |")
    print("|---|---|---|")
    print(f"| no request constrained | {med['none']:.1f} | {med['tps_none']:.1f} |")
    print(f"| half with a JSON schema: the constrained half | {med['half_constrained']:.1f} | "
          f"{med['tps_half']:.1f} (whole batch) |")
    print(f"| half with a JSON schema: the unconstrained half | {med['half_free']:.1f} | |")
    print(f"constrained / unconstrained TPOT {med['half_constrained'] / med['none']:.3f} (target <= 1.10); "
          f"unconstrained half / no constraints {med['half_free'] / med['none']:.3f}; compilations while measured: "
          f"{llm.engine.get_stats().num_compilations - compilations}")


if __name__ == "__main__":
    main()
