"""Issue 58's second MoE goal, measured in one process: the batch-1 decode step of the random Qwen3-MoE
(configs/bench/moe_w1.yaml's `random:qwen3_moe_0.7b`) against its dense twin with the same active parameters
(`random:qwen3_dense_0.7b_active`, configs/bench/moe_dense_active.yaml). Goal: the MoE's step at most 1.5x the dense.

Run: python -m benchmarks.moe_dense_step [--rounds 6] [--output-tokens 64] [--out FILE.json]

Both engines are built once (float32, one sequence, layers unrolled with the native kernels, as the bench configs
run them) and warmed; then rounds alternate MoE, dense, dense, MoE, ... so both see the same machine load. Each round
generates one request (a random 100-token prompt, `--output-tokens` greedy tokens, EOS ignored) and records every
engine step's wall time (StepProbe); a round's figure is the median step (decode steps; the one prefill step is an
outlier the median drops). Prints the CPU, the load average before and after, every round, the medians of the rounds
and their ratio, and a JSON line at the end.
"""

import argparse
import json
import statistics
import time

import numpy as np

from jaxpaged.bench.machine_info import load_average, machine_info
from jaxpaged.bench.random_models import materialize
from jaxpaged.bench.step_probe import StepProbe
from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import cache_root

MODELS = {"moe": "random:qwen3_moe_0.7b", "dense": "random:qwen3_dense_0.7b_active"}
ENGINE_OPTIONS = dict(max_num_seqs=1, max_num_batched_tokens=128, max_model_len=256, dtype="float32",
                      num_kv_blocks=64)
PROMPT_TOKENS = 100
GOAL = 1.5


def median_step_s(llm: LLM, prompt: list[int], output_tokens: int) -> float:
    """The median wall time of the engine steps that generate `output_tokens` tokens after `prompt`."""
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    with StepProbe(llm.engine) as probe:
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return statistics.median(probe.step_s)


def main() -> None:
    parser = argparse.ArgumentParser(description="The MoE's batch-1 decode step against its dense twin's, alternated.")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per model, alternated (default 6)")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--out", help="also write the JSON result here")
    options = parser.parse_args()
    load_before = load_average()
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 40000, PROMPT_TOKENS)]
    engines = {}
    for name, model in MODELS.items():
        started = time.perf_counter()
        engines[name] = LLM(materialize(model, cache_root() / "random-models"), **ENGINE_OPTIONS)
        median_step_s(engines[name], prompt, 4)  # warm: every bucket this run uses has run once
        print(f"{name}: {model} built and warmed in {time.perf_counter() - started:.0f} s", flush=True)
    order = [name for pair in range(options.rounds) for name in (("moe", "dense") if pair % 2 == 0
                                                                  else ("dense", "moe"))]
    rounds: dict[str, list[float]] = {name: [] for name in MODELS}
    for name in order:
        rounds[name].append(median_step_s(engines[name], prompt, options.output_tokens))
        print(f"  {name:5s} median step {rounds[name][-1] * 1e3:7.2f} ms", flush=True)
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    ratio = medians["moe"] / medians["dense"]
    result = dict(machine=machine_info(), load_before=load_before, load_after=load_average(),
                  engine_options=ENGINE_OPTIONS, output_tokens=options.output_tokens, rounds=rounds,
                  median_step_ms={name: value * 1e3 for name, value in medians.items()}, ratio=ratio,
                  goal_met=ratio <= GOAL)
    print(f"batch-1 step: MoE {medians['moe'] * 1e3:.2f} ms, dense {medians['dense'] * 1e3:.2f} ms, ratio "
          f"{ratio:.2f} (goal <= {GOAL}: {'met' if ratio <= GOAL else 'missed'}); load {load_before} -> "
          f"{result['load_after']}")
    print(json.dumps(result))
    if options.out:
        with open(options.out, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
