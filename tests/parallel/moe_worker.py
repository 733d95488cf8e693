"""Runs in a subprocess with forced CPU devices: a MoE model's greedy tokens under (tp, expert parallel) layouts
against one device's.

Usage: JAX_NUM_CPU_DEVICES=4 python -m tests.parallel.moe_worker MODEL_DIR LAYOUTS_JSON PROMPTS_JSON
LAYOUTS_JSON lists [tp, enable_expert_parallel] pairs. Prints one JSON line: per layout, whether the greedy tokens
equal tp = 1's, and the shape of one device's shard of the first layer's gate experts.
"""

import json
import sys

import jax

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from tests.lazy_compile import engines_compile_on_first_use

ENGINE_OPTIONS = dict(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=48, block_size=4,
                      dtype="float32", attention_backend="xla", compilation_cache_dir="")


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def expert_shard_shape(llm: LLM) -> list[int]:
    """One device's shard of the first stored gate-experts array (per layer on a CPU: [E, hidden, inner])."""
    state = llm.engine.runner.step.state
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        if "expert_gate" in jax.tree_util.keystr(path) and "scale" not in jax.tree_util.keystr(path):
            return list(leaf.addressable_shards[0].data.shape)
    raise AssertionError("no expert_gate weight in the model state")


def main() -> None:
    model_dir, layouts, prompts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    options = {**ENGINE_OPTIONS, **(json.loads(sys.argv[4]) if len(sys.argv) > 4 else {})}
    engines_compile_on_first_use()  # each engine compiles the few programs it runs
    expected = greedy(LLM(model_dir, **options), prompts)
    results = []
    for tp, expert_parallel in layouts:
        llm = LLM(model_dir, **options, tensor_parallel_size=tp, enable_expert_parallel=expert_parallel)
        tokens = greedy(llm, prompts)
        results.append(dict(tp=tp, expert_parallel=expert_parallel, identical=tokens == expected, tokens=tokens,
                            expected=expected, expert_shard=expert_shard_shape(llm)))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
