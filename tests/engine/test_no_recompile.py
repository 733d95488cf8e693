"""After warm-up the engine never compiles: a mixed workload leaves the XLA compilation counter where it was."""

import numpy as np
import pytest

from jaxpaged.sampling.params import SamplingParams

# One worker builds the shared tiny engine (it compiles) for every test that uses it.
pytestmark = pytest.mark.xdist_group("tiny_llm")


def test_mixed_workload_compiles_nothing_after_warmup(tiny_llm):
    engine = tiny_llm.engine
    before = engine.get_stats()
    rng = np.random.default_rng(0)
    shared_prefix = rng.integers(10, 40000, 40).tolist()
    prompts, params = [], []
    for i in range(24):
        length = int(rng.integers(1, 150))  # 1 token up to several chunks of the 64-token budget
        tokens = rng.integers(10, 40000, length).tolist()
        prompts.append({"prompt_token_ids": shared_prefix + tokens if i % 3 == 0 else tokens,
                        "cache_salt": "tenant-b" if i % 5 == 0 else None})
        params.append([
            SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 40)), ignore_eos=True),
            SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=20, ignore_eos=True),
            SamplingParams(temperature=1.0, top_k=5, min_p=0.1, repetition_penalty=1.2, presence_penalty=0.5,
                           max_tokens=16, logprobs=3, min_tokens=4),
            SamplingParams(temperature=0.7, frequency_penalty=0.3, logit_bias={5: 3.0}, max_tokens=12, n=2),
        ][i % 4])
    outputs = tiny_llm.generate(prompts, params, use_tqdm=False)
    after = engine.get_stats()

    assert len(outputs) == len(prompts)
    assert after.prefix_cache_hits > before.prefix_cache_hits, "the shared prefix should hit"
    assert after.num_preemptions > before.num_preemptions, "the 48-block pool should force preemption"
    assert after.num_compilations == before.num_compilations
