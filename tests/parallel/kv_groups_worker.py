"""Worker of test_tensor_data_parallel.py::test_kv_cache_groups_at_tp2 (run on forced CPU devices): greedy tokens and
log-probabilities of Gemma 2 with KV cache groups, on one device and split over two."""

import json
import random
import sys

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from tests.lazy_compile import engines_compile_on_first_use

OPTIONS = dict(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=36, block_size=4,
               dtype="float32", attention_backend="xla", compilation_cache_dir="")


def main() -> None:
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(100, 49000) for _ in range(n)]} for n in (37, 50, 21, 44)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
    results = []
    engines_compile_on_first_use()  # each engine compiles the few programs it runs
    for tp in (1, 2):
        llm = LLM(sys.argv[1], tensor_parallel_size=tp, **OPTIONS)  # type: ignore[arg-type]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results.append(dict(tp=tp, num_groups=llm.engine.runner.plan.kv_spec.num_groups,
                            kv_shards=len(llm.engine.runner.kv_cache.sharding.device_set),
                            preemptions=llm.engine.get_stats().num_preemptions,
                            tokens=[list(o.outputs[0].token_ids) for o in outputs],
                            logprobs=[o.outputs[0].cumulative_logprob for o in outputs]))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
