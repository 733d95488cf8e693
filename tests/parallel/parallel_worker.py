"""Runs in a subprocess with forced CPU devices: one model under several (dp, tp) layouts vs tp = dp = 1.

Usage: JAX_NUM_CPU_DEVICES=4 python -m tests.parallel.parallel_worker MODEL_DIR CASES_JSON [MODEL_DIR CASES_JSON ...]
CASES_JSON lists cases, each [LAYOUTS, OPTIONS]: LAYOUTS lists [dp, tp] pairs, or [dp, tp, true] for async
scheduling under that layout; OPTIONS: engine options for the case's reference and each of its layouts alike
({"quantization": "int8"}). One process runs every case of every model, so the tests pay for one JAX start.
Prints one JSON line: per model, per case, per layout, the max relative logits error vs tp=1, whether greedy
outputs are identical, prefix-hit tokens per data-parallel rank, and compilations after warm-up.
"""

import json
import sys

import numpy as np

from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import ScheduledRequest, SchedulerOutput
from jaxpaged.llm import LLM
from jaxpaged.runner import compile_counter
from jaxpaged.sampling.params import SamplingParams
from tests.lazy_compile import engines_compile_on_first_use, warmed_up_as_served

# Small limits force chunked prefill (16-token steps), preemption (a 14-block pool) and prefix hits.
ENGINE_OPTIONS = dict(max_model_len=48, max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=14, block_size=4,
                      dtype="float32", attention_backend="xla", compilation_cache_dir="")
SHARED_PREFIX = "You are a helpful assistant. Answer briefly and politely, in English. Question: "
PROMPTS = [SHARED_PREFIX + "what is two plus two?", "def fibonacci(n):", SHARED_PREFIX + "name a colour.",
           "The capital of France is", SHARED_PREFIX + "what is a paged KV cache?", "Once upon a time"]


def step_logits(llm: LLM) -> np.ndarray:
    """Logits of four token rows of one mixed step (a 6-token prefill beside a 3-token continuation)."""
    runner = llm.engine.runner
    parts = [(list(range(100, 106)), 0, [1, 2]), ([7, 8, 9], 5, [3, 4])]
    scheduled = [ScheduledRequest(Request(f"r{i}", tokens), tokens, start, blocks, True)
                 for i, (tokens, start, blocks) in enumerate(parts)]
    output = SchedulerOutput(scheduled, 9, set(), set())
    bucket, batch = runner.prepare(output)
    batch.sample_indices[:4] = [2, 5, 6, 8]  # rows of both sequences, not only their last tokens
    return np.asarray(runner.compute_logits(bucket, batch))[:4]


def greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params, use_tqdm=False)]


def run_case(model_dir: str | None, layouts: list[list], case_options: dict) -> list[dict]:
    """One reference engine (dp = tp = 1) with case_options, then each layout compared against it."""
    options = {**ENGINE_OPTIONS, **case_options}
    engines_compile_on_first_use()  # the reference compiles what it runs; the layouts warm up (compiles counted)
    reference = LLM(model_dir, **options)  # type: ignore[arg-type]
    expected_logits, expected_tokens = step_logits(reference), greedy(reference)
    results = []
    for dp, tp, *rest in layouts:  # [dp, tp] or [dp, tp, async_scheduling]
        with warmed_up_as_served():
            llm = LLM(model_dir, **options, data_parallel_size=dp, tensor_parallel_size=tp,
                      async_scheduling=bool(rest and rest[0]))
        compiled_after_warmup = compile_counter.num_compilations()
        logits = step_logits(llm)
        tokens = greedy(llm)
        engine = llm.engine
        # After a reset no rank remembers a prompt it served: asking it again finds no cached block.
        hits_before = engine.get_stats().prefix_cache_hits
        reset = llm.reset_prefix_cache()
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=1), use_tqdm=False)
        results.append(dict(
            reset=reset, hits_after_reset=engine.get_stats().prefix_cache_hits - hits_before,
            dp=dp, tp=tp,
            logits_rel_error=float(np.max(np.abs(logits - expected_logits)) / np.max(np.abs(expected_logits))),
            greedy_identical=tokens == expected_tokens,
            kv_shards=len(engine.runner.kv_cache.sharding.device_set),
            hits_per_rank=[s.stats().prefix_cache_hits for s in engine.ranks.schedulers],
            preemptions=engine.get_stats().num_preemptions,
            compilations_while_serving=compile_counter.num_compilations() - compiled_after_warmup))
    return results


def main() -> None:
    pairs = sys.argv[1:]
    results = []
    for model_dir, cases_json in zip(pairs[::2], pairs[1::2]):
        model = None if model_dir == "default" else model_dir  # the embedded SmolLM2-135M
        results.append([run_case(model, layouts, options) for layouts, options in json.loads(cases_json)])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
