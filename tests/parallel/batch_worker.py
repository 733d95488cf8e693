"""One process of a multi-host SPMD batch script, as a user would write it: every process builds the same LLM and
calls generate with the same inputs, three times (run_requests); process 0 writes its outputs' token ids, greedy
log-probabilities and cached-token counts and its memory plan, a follower what it got ([]).
The script never closes the LLM: its end (atexit) must still let every process exit 0. With `forever`, each process
writes OUT.json once its LLM is built, then generates until it is killed (or loses the job).

    python -m tests.parallel.batch_worker MODEL_DIR COORDINATOR NUM_PROCESSES PROCESS_ID OUT.json [forever]
"""

import json
import sys

import numpy as np

BLOCK_SIZE = 4
KV_CACHE_MEMORY = 1 << 20
ENGINE_OPTIONS = dict(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=32, block_size=BLOCK_SIZE,
                      dtype="float32", attention_backend="xla", compilation_cache_dir="",
                      kv_cache_memory=KV_CACHE_MEMORY)
"""Small limits: 32-token steps chunk the longest prompt, 4-token blocks make block size +- 1 short prompts; a 1 MiB
pool per device (room for every request at once)."""
PROMPT_LENS = [1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 11 * BLOCK_SIZE + 2]
"""Edge lengths: one token, a block less one, one block, a block and one, many blocks (two prefill chunks)."""
DISTRIBUTED_TIMEOUT_S = 8.0


def prompts() -> list[dict]:
    """Seeded random token ids, as prompts of PROMPT_LENS tokens."""
    rng = np.random.default_rng(0)
    return [{"prompt_token_ids": rng.integers(100, 40000, size=num).tolist()} for num in PROMPT_LENS]


def greedy_params():
    from jaxpaged.sampling.params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)


def sampled_params():
    from jaxpaged.sampling.params import SamplingParams

    return SamplingParams(temperature=0.8, top_k=50, seed=1234, max_tokens=8, ignore_eos=True)


def token_ids(outputs) -> list[list[int]]:
    return [list(output.outputs[0].token_ids) for output in outputs]


def token_logprobs(outputs) -> list[list[float]]:
    """Each output's log-probability of each token it generated."""
    return [[step[token].logprob for token, step in zip(output.outputs[0].token_ids, output.outputs[0].logprobs)]
            for output in outputs]


def run_requests(llm) -> dict:
    """The script's generate calls, in order, and what they returned: the prompts greedily (tokens and their
    log-probabilities), one seeded sampled request, then the longest prompt again (a prefix hit ending mid-block:
    a block copy in every KV cache group), with its cached-token count."""
    greedy = llm.generate(prompts(), greedy_params(), use_tqdm=False)
    sampled = llm.generate(prompts()[3], sampled_params(), use_tqdm=False)
    again = llm.generate(prompts()[-1], greedy_params(), use_tqdm=False)
    return {"greedy": token_ids(greedy), "greedy_logprobs": token_logprobs(greedy), "sampled": token_ids(sampled),
            "again": token_ids(again), "again_logprobs": token_logprobs(again),
            "again_cached": [output.num_cached_tokens for output in again]}


def memory_plan(llm) -> dict:
    """What process 0's memory plan says of the KV pool: its groups, block bytes and blocks per sequence."""
    plan = llm.engine.runner.memory_plan
    return dict(group_windows=list(plan.group_windows), bytes_per_block=plan.kv_bytes_per_block_per_device,
                num_kv_blocks=plan.num_kv_blocks, blocks_per_sequence=plan.blocks_per_max_len_sequence,
                max_sequences=plan.max_sequences_at_max_model_len)


def main(model_dir: str, coordinator: str, num_processes: int, process_id: int, out_path: str,
         forever: bool) -> None:
    from jaxpaged.llm import LLM

    llm = LLM(model_dir, tensor_parallel_size=num_processes, coordinator_address=coordinator,
              num_processes=num_processes, process_id=process_id, distributed_timeout=DISTRIBUTED_TIMEOUT_S,
              **ENGINE_OPTIONS)
    if forever:
        with open(out_path, "w") as out:
            json.dump({"ready": True}, out)
        while True:
            llm.generate(prompts(), greedy_params(), use_tqdm=False)
    result = run_requests(llm)
    if process_id == 0:
        result["memory_plan"] = memory_plan(llm)
    with open(out_path, "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6:] == ["forever"])
