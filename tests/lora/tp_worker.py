"""Runs in a subprocess with 2 forced CPU devices: a mixed batch of base rows and two adapters' rows at tp = 1 and
tp = 2 (the model has one KV head, so tp 2 repeats it and the adapters' k/v B with it).

Usage: JAX_NUM_CPU_DEVICES=2 python -m tests.lora.tp_worker MODEL_DIR ADAPTER_DIR ADAPTER_DIR
Prints one JSON line: the greedy tokens of both layouts, how the tp = 2 slot arrays are split, and the compiles
after warm-up at tp = 2.
"""

import json
import sys

from jaxpaged.llm import LLM
from jaxpaged.lora.request import LoRARequest
from jaxpaged.runner import compile_counter
from jaxpaged.sampling.params import SamplingParams
from tests.lazy_compile import engines_compile_on_first_use, warmed_up_as_served

OPTIONS = dict(max_model_len=64, max_num_seqs=8, max_num_batched_tokens=32, num_kv_blocks=32, dtype="float32",
               attention_backend="xla", compilation_cache_dir="", enable_lora=True, max_loras=2, max_lora_rank=8)
PROMPTS = [[1, 400, 401, 402, 403, 404], [1, 77, 78, 79, 80, 81, 82], [1, 5, 6, 7, 8], [1, 900, 901, 902]]


def greedy(llm: LLM, loras: list) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False, lora_request=loras)
    return [list(output.outputs[0].token_ids) for output in outputs]


def main() -> None:
    model_dir, *adapter_dirs = sys.argv[1:]
    adapters = [LoRARequest(f"a{index}", index + 1, path) for index, path in enumerate(adapter_dirs)]
    loras = [None, adapters[0], adapters[1], adapters[0]]
    engines_compile_on_first_use()  # the reference compiles what it runs; tp = 2 warms up (its compiles counted)
    expected = greedy(LLM(model_dir, **OPTIONS), loras)
    with warmed_up_as_served():
        llm = LLM(model_dir, **OPTIONS, tensor_parallel_size=2)
    compiled = compile_counter.num_compilations()
    got = greedy(llm, loras)
    slots = llm.engine.runner.lora
    assert slots is not None
    split = {name: [list(shard.data.shape) for shard in value[0].addressable_shards]
             for name, value in slots.placed.items() if name in ("lora_b.q_proj", "lora_a.q_proj", "lora_a.o_proj",
                                                                 "lora_b.o_proj", "lora_b.k_proj")}
    print(json.dumps(dict(expected=expected, got=got, split=split,
                          compilations_while_serving=compile_counter.num_compilations() - compiled)))


if __name__ == "__main__":
    main()
