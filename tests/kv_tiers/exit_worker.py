"""Runs in a subprocess: engines with a disk tier ask their prompts and the process ends without LLM.close().

Usage: python -m tests.kv_tiers.exit_worker MODEL_DIR PROMPTS_JSON DROP_OPTIONS_JSON EXIT_OPTIONS_JSON. First an LLM
with DROP_OPTIONS asks the prompts and is deleted and collected; then one with EXIT_OPTIONS (another disk directory)
asks them and is still alive when the interpreter exits, as in a script's global. One process for both (one JAX
start). Prints one JSON line: per LLM ("drop", "exit"), each prompt's num_cached_tokens, and for "drop" how many
block files its disk tier holds once it was collected.
"""

import gc
import json
import pathlib
import sys

from jaxpaged.llm import LLM
from tests.kv_tiers.tier_worker import GREEDY
from tests.lazy_compile import engines_compile_on_first_use

_kept: list[LLM] = []  # referenced until the interpreter's exit, as in a script's global


def ask(llm: LLM, prompts: list[list[int]]) -> list[int]:
    """Each prompt's num_cached_tokens, asked one after another."""
    return [llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].num_cached_tokens
            for prompt in prompts]


def main() -> None:
    model_dir, prompts = sys.argv[1], json.loads(sys.argv[2])
    drop_options, exit_options = json.loads(sys.argv[3]), json.loads(sys.argv[4])
    engines_compile_on_first_use()  # the engines compile the few programs they run; nothing here counts compiles
    dropped = LLM(model_dir, **drop_options)
    drop: dict = dict(num_cached_tokens=ask(dropped, prompts))
    del dropped
    gc.collect()
    drop["files_after_drop"] = len(list(pathlib.Path(drop_options["kv_offload_dir"]).rglob("*.kv")))
    kept = LLM(model_dir, **exit_options)
    _kept.append(kept)
    print(json.dumps(dict(drop=drop, exit=dict(num_cached_tokens=ask(kept, prompts)))))


if __name__ == "__main__":
    main()
