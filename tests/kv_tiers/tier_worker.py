"""Runs in a subprocess: engines with KV tiers asked a sequence of prompts (a restarted engine on a disk tier, or a
tensor/data-parallel layout on forced CPU devices).

Usage: python -m tests.kv_tiers.tier_worker MODEL_DIR RUNS_JSON, RUNS_JSON a list of {"options": {...},
"prompts": [[token ids], ...]}. Each run builds one LLM with the options and asks its prompts one after another.
Prints one JSON line: per run, per prompt, its num_cached_tokens, token ids and cumulative logprob, then the run's
per-tier stats and how many shards its KV cache has.
"""

import dataclasses
import json
import sys

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from tests.lazy_compile import engines_compile_on_first_use

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=1)


def main() -> None:
    model_dir, runs = sys.argv[1], json.loads(sys.argv[2])
    results = []
    engines_compile_on_first_use()  # each engine compiles the few programs it runs
    for run in runs:
        llm = LLM(model_dir, **run["options"])
        answers = []
        for prompt in run["prompts"]:
            out = llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0]
            answers.append(dict(num_cached_tokens=out.num_cached_tokens, token_ids=list(out.outputs[0].token_ids),
                                cumulative_logprob=out.outputs[0].cumulative_logprob))
        stats = llm.engine.get_stats()
        results.append(dict(answers=answers, tiers={name: dataclasses.asdict(tier) for name, tier in
                                                     stats.kv_tiers.items()},
                            kv_shards=len(llm.engine.runner.kv_cache.sharding.device_set)))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
