"""Runs in a subprocess: an engine with a disk tier asks its prompts and the process ends without LLM.close().

Usage: python -m tests.kv_tiers.exit_worker MODEL_DIR OPTIONS_JSON PROMPTS_JSON MODE. MODE "exit": the LLM is still
alive when the interpreter exits; "drop": the LLM is deleted and collected first, and the line printed says how
many block files the disk tier then holds. Prints one JSON line: each prompt's num_cached_tokens (and the count).
"""

import gc
import json
import pathlib
import sys

from jaxpaged.llm import LLM
from tests.kv_tiers.tier_worker import GREEDY

_kept: list[LLM] = []  # "exit": referenced until the interpreter's exit, as in a script's global


def main() -> None:
    model_dir, options, prompts, mode = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    llm = LLM(model_dir, **options)
    cached = [llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].num_cached_tokens
              for prompt in prompts]
    result: dict = dict(num_cached_tokens=cached)
    if mode == "drop":
        del llm
        gc.collect()
        result["files_after_drop"] = len(list(pathlib.Path(options["kv_offload_dir"]).rglob("*.kv")))
    else:
        _kept.append(llm)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
