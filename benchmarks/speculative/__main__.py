"""Speculative decoding (issue 42) on the embedded model: time per output token and output tokens/s, speculation
off against n-gram proposals and a draft model, on copy-heavy chat requests at batch sizes 1, 8 and 64, in one run.

The draft model is the embedded model with its projections in int8 (`--draft-quantization`), optionally cut to its
first `--draft-layers` layers (truncated_draft.py), written once under ~/.cache/jaxpaged/drafts/; or `--draft PATH`.

Copy-heavy requests are built from text that ships with the project (its docs and its own Python source): "repeat
this passage", "rename this identifier in this code", "quote the sentence about X" — what n-gram lookup exists for.
Each batch size runs the same requests with every method (`--methods`), alternated `--repeats` times; medians.
`--workload w1` runs W1 instead (random-token prompts of 32-256 tokens, exactly 64 greedy tokens, the engine sized as
configs/bench/w1_offline.yaml), alternated the same way: at a batch where nobody proposes, the two engines do the
same work, and alternating keeps a shared machine's load changes out of the ratio.

    python -m benchmarks.speculative [--workload copy|w1] [--batch-sizes 1 8 64] [--max-tokens 128] [--repeats 3]
                                     [--methods off ngram draft_model] [--draft-layers N]
                                     [--draft-quantization int8|w8a8|''] [--draft PATH] [--out DIR]

Prints a markdown table (and writes results.json and speedup.png under --out).
"""

import argparse
import json
import pathlib
import statistics
import sys
import time
from typing import Any, Optional

from jaxpaged.bench.machine_info import describe_machine, machine_info

ROOT = pathlib.Path(__file__).resolve().parents[2]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
def truncated_draft_path(num_layers: Optional[int], quantization: Optional[str]) -> pathlib.Path:
    """The embedded model's first num_layers layers (None: all), projections in `quantization`, as a draft written
    once under the jaxpaged cache."""
    from benchmarks.speculative.truncated_draft import write_truncated_draft
    from jaxpaged.weights.converted_store import is_converted_checkpoint
    from jaxpaged.weights.loader import cache_root

    path = cache_root() / "drafts" / f"SmolLM2-135M-Instruct-{num_layers or 'all'}-layers-{quantization or 'float'}"
    if not is_converted_checkpoint(path):
        write_truncated_draft(None, num_layers, path, quantization)
    return path


def copy_heavy_messages(count: int) -> list[list[dict[str, str]]]:
    """`count` chat requests, cycling over three copy-heavy tasks on passages of the project's docs and code."""
    docs = [p for p in (ROOT / "docs").glob("*.md")]
    code = sorted((ROOT / "jaxpaged" / "core").glob("*.py"))
    passages = [_passage(path.read_text(), 900) for path in sorted(docs)[:8]]
    functions = [_code(path.read_text(), 700) for path in code[:8]]
    requests = []
    for index in range(count):
        task = index % 3
        if task == 0:
            text = passages[index % len(passages)]
            prompt = f"Repeat the following text exactly, word for word:\n\n{text}"
        elif task == 1:
            text = functions[index % len(functions)]
            prompt = ("Rewrite this Python code with the variable `request` renamed to `req`. Output only code."
                      f"\n\n{text}")
        else:
            text = passages[(index + 3) % len(passages)]
            prompt = f"Here is a document:\n\n{text}\n\nCopy its first three sentences."
        requests.append([{"role": "user", "content": prompt}])
    return requests


def _code(text: str, num_chars: int) -> str:
    """A run of whole lines of Python source from the first `def` on, up to about num_chars characters."""
    start = max(0, text.find("\n    def "))
    lines, total = [], 0
    for line in text[start:].splitlines():
        lines.append(line)
        total += len(line) + 1
        if total >= num_chars:
            break
    return "\n".join(lines).strip("\n")


def _passage(text: str, num_chars: int) -> str:
    """Whole paragraphs of prose (no headings, tables or lists) from the second quarter of `text` on, up to about
    num_chars characters."""
    paragraphs = [p.strip() for p in text[len(text) // 4:].split("\n\n")]
    chosen: list[str] = []
    for paragraph in paragraphs:
        if not paragraph or paragraph[0] in "#|-*`>" or not 80 <= len(paragraph) <= num_chars:
            continue  # not prose, or one paragraph longer than the whole passage (the prompt must fit the model)
        chosen.append(paragraph)
        if sum(len(p) for p in chosen) >= num_chars:
            break
    return "\n\n".join(chosen) if chosen else text[:num_chars]


def w1_prompts(count: int, seed: int = 0) -> list[dict[str, list[int]]]:
    """W1's prompts: `count` random-token prompts of uniform length 32-256."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(100, 40000, int(rng.integers(32, 257))).tolist()} for _ in range(count)]


def run_batch(llm, requests: list, max_tokens: int, workload: str) -> dict[str, Any]:
    from jaxpaged.sampling.params import SamplingParams

    stats = llm.engine.scheduler.spec_stats
    drafted, accepted, drafts = stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_drafts
    start = time.perf_counter()
    if workload == "w1":
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = llm.generate(requests, params, use_tqdm=False)
    else:
        outputs = llm.chat(requests, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    seconds = time.perf_counter() - start
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    rows = stats.num_drafts - drafts
    return {"seconds": seconds, "output_tokens": num_tokens, "output_tokens_per_s": num_tokens / seconds,
            "ms_per_output_token_per_request": 1000 * seconds * len(requests) / num_tokens,
            "draft_tokens": stats.num_draft_tokens - drafted, "accepted_tokens": stats.num_accepted_tokens - accepted,
            "mean_accepted_length": 1 + (stats.num_accepted_tokens - accepted) / rows if rows else 0.0,
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs]}


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["copy", "w1"], default="copy")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default: 1 8 64 (w1: 64)")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: 128 (w1: 64)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-speculative-tokens", type=int, default=NGRAM["num_speculative_tokens"])
    parser.add_argument("--methods", nargs="+", choices=["off", "ngram", "draft_model"],
                        default=["off", "ngram", "draft_model"], help="the first is the speedups' reference")
    parser.add_argument("--draft", type=pathlib.Path, default=None, help="the draft model (default: a truncated one)")
    parser.add_argument("--draft-layers", type=int, default=None,
                        help="layers of the embedded model the default draft keeps (default: all)")
    parser.add_argument("--draft-quantization", choices=["int8", "w8a8", ""], default="int8",
                        help="the default draft's projections ('' keeps them float)")
    parser.add_argument("--draft-speculative-tokens", type=int, default=None,
                        help="the draft model's k (default: --num-speculative-tokens)")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    w1 = args.workload == "w1"
    args.batch_sizes = args.batch_sizes or ([64] if w1 else [1, 8, 64])
    args.max_tokens = args.max_tokens or (64 if w1 else 128)
    from jaxpaged.llm import LLM

    common = dict(dtype=args.dtype, max_model_len=512 if w1 else 1024, max_num_seqs=max(64, *args.batch_sizes),
                  max_num_batched_tokens=512 if w1 else 1024)
    k = args.num_speculative_tokens
    configs: dict[str, Optional[dict[str, Any]]] = {"off": None, "ngram": {**NGRAM, "num_speculative_tokens": k}}
    if "draft_model" in args.methods:
        draft = args.draft or truncated_draft_path(args.draft_layers, args.draft_quantization or None)
        configs["draft_model"] = {"method": "draft_model", "model": str(draft),
                                  "num_speculative_tokens": args.draft_speculative_tokens or k}
    engines = {name: LLM(None, **common, **({} if spec is None else {"speculative_config": spec}))
               for name, spec in configs.items() if name in args.methods}
    rows: list[dict[str, Any]] = []
    for batch_size in args.batch_sizes:
        requests = w1_prompts(batch_size) if w1 else copy_heavy_messages(batch_size)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
        for _ in range(args.repeats):
            for name, llm in engines.items():
                runs[name].append(run_batch(llm, requests, args.max_tokens, args.workload))
        baseline = runs[args.methods[0]][0]["token_ids"]
        for name, results in runs.items():
            row = {key: statistics.median(r[key] for r in results) for key in results[0] if key != "token_ids"}
            rows.append({"batch_size": batch_size, "speculation": name,
                         "same_tokens_as_off": results[0]["token_ids"] == baseline, **row})
        reference = rows[-len(runs)]
        for row in rows[-len(runs):]:
            row["speedup_tok_per_s"] = row["output_tokens_per_s"] / reference["output_tokens_per_s"]
        print(f"batch {batch_size}: " + ", ".join(f"{row['speculation']} {row['speedup_tok_per_s']:.2f}x"
                                                  for row in rows[-len(runs):]), file=sys.stderr)
    machine = machine_info()
    print(f"\nMachine: {describe_machine(machine)}, load {machine.get('load_average')}\n")
    print("| batch | speculation | output tok/s | ms/token/request | speedup | drafted | accepted | mean accepted "
          "length | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['batch_size']} | {row['speculation']} | {row['output_tokens_per_s']:.1f} | "
              f"{row['ms_per_output_token_per_request']:.1f} | {row.get('speedup_tok_per_s', 1.0):.2f} | "
              f"{row['draft_tokens']:.0f} | {row['accepted_tokens']:.0f} | {row['mean_accepted_length']:.2f} | "
              f"{row['same_tokens_as_off']} |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
        _plot(rows, args.out / "speedup.png")


def _plot(rows: list[dict[str, Any]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({row["batch_size"] for row in rows})
    methods = list(dict.fromkeys(row["speculation"] for row in rows))[1:]  # the first is the reference
    fig, ax = plt.subplots(figsize=(5, 3.2))
    width = 0.8 / max(1, len(methods))
    for offset, method in enumerate(methods):
        speedups = {row["batch_size"]: row["speedup_tok_per_s"] for row in rows if row["speculation"] == method}
        ax.bar([i + offset * width for i in range(len(batches))], [speedups[b] for b in batches], width,
               label=method)
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(batches))], [str(b) for b in batches])
    ax.legend()
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xlabel("batch size")
    ax.set_ylabel("output tok/s, against off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
