"""`jaxpaged advise PROMPTS.jsonl`: which prompts share content the prefix cache cannot reuse, and what to move.

Offline counterpart of the engine's PrefixAdvisor: with every prompt at hand it can afford exact answers. Prompts
are grouped by shared content found at any offset (seeded by the advisor's content-defined chunks, then extended
token by token to the exact common run). For each prompt after the first of its group:
- prefix: its longest common prefix with an earlier prompt of the group (what the prefix cache can serve);
- run: its longest common run with an earlier prompt that lies after that prefix (what it cannot);
- gain: the extra full KV blocks a reordering (the run moved right after the prefix) would let the cache serve.
"""

import argparse
import dataclasses
import json
import pathlib
import statistics
from collections.abc import Sequence
from typing import Any, Optional

from jaxpaged.core.prefix_advisor import MIN_CHUNK, chunk_starts

_MAX_OCCURRENCES = 8
"""Places remembered per chunk content: bounds the work on prompts that repeat one chunk many times."""


@dataclasses.dataclass(frozen=True)
class PromptMatch:
    """How one prompt relates to the earlier prompts of its group."""

    prefix: int
    run_start: int
    """Where its longest shared run after the prefix starts (in this prompt)."""
    run_len: int


@dataclasses.dataclass(frozen=True)
class GroupReport:
    """One group of prompts that share a long run of tokens."""

    members: list[int]
    """0-based prompt (line) numbers, in file order."""
    diverge_at: int
    """Earliest token where a member left the group's shared prefix."""
    varying_end: int
    """Where the shared run starts after the varying part (median over members)."""
    shared_run: int
    """Median length of that run."""
    reuse_per_request: float
    """Mean gain over the members after the first (the first computes everything anyway)."""


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _longest_runs(prompts: list[list[int]], min_shared: int) -> tuple[list[int], list[Optional[PromptMatch]]]:
    """Each prompt's group root (prompts sharing >= min_shared tokens are linked) and its best match with an
    earlier prompt (None: it shares no seed chunk with any)."""
    parent = list(range(len(prompts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    places: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    heads: dict[tuple[int, ...], list[int]] = {}
    """Prompts by their first MIN_CHUNK tokens: candidates for a common prefix that no chunk seed would find (a
    short prompt can be a single open chunk)."""
    matches: list[Optional[PromptMatch]] = []
    for i, a in enumerate(prompts):
        bounds = chunk_starts(a) + [len(a)]
        chunks = [(bounds[k], tuple(a[bounds[k]:bounds[k + 1]])) for k in range(len(bounds) - 1)]
        seeds = [(pos, j, pos_j) for pos, chunk in chunks if len(chunk) >= MIN_CHUNK
                 for j, pos_j in places.get(chunk, ())]
        head = tuple(a[:MIN_CHUNK])
        candidates = {j for _, j, _ in seeds} | set(heads.get(head, ()))
        prefixes = {j: _common_prefix(a, prompts[j]) for j in candidates}
        prefix = max(prefixes.values(), default=0)
        best: tuple[int, int, int] = (0, -len(a), -1)  # (run length, -run start, earlier prompt)
        done: dict[tuple[int, int], int] = {}  # (earlier prompt, offset) -> end of the run already extended
        for pos, j, pos_j in seeds:
            b, offset = prompts[j], pos_j - pos
            if pos < max(prefix, done.get((j, offset), -1)):
                continue
            start, end = pos, pos
            while start > prefix and start + offset > 0 and a[start - 1] == b[start - 1 + offset]:
                start -= 1
            while end < len(a) and end + offset < len(b) and a[end] == b[end + offset]:
                end += 1
            done[(j, offset)] = end
            best = max(best, (end - start, -start, j))
            if end - start >= min_shared:
                parent[find(i)] = find(j)
        for j, shared in prefixes.items():
            if shared >= min_shared:
                parent[find(i)] = find(j)
        run_len, neg_start, _ = best
        matches.append(PromptMatch(prefix, -neg_start, run_len) if prefixes else None)
        if len(heads.setdefault(head, [])) < _MAX_OCCURRENCES:
            heads[head].append(i)
        for pos, chunk in chunks:
            occurrences = places.setdefault(chunk, [])
            if len(occurrences) < _MAX_OCCURRENCES:
                occurrences.append((i, pos))
    return [find(i) for i in range(len(prompts))], matches


def analyse(prompts: list[list[int]], *, block_size: int = 16, min_shared: int = 32) -> list[GroupReport]:
    """Groups of >= 2 prompts sharing >= min_shared tokens, largest reuse first."""
    roots, matches = _longest_runs(prompts, min_shared)
    groups: dict[int, list[int]] = {}
    for i, root in enumerate(roots):
        groups.setdefault(root, []).append(i)
    reports = []
    for members in groups.values():
        if len(members) < 2:
            continue
        later = [m for m in (matches[i] for i in members[1:]) if m is not None]
        # The gain of one prompt: the whole blocks its cached prefix grows by if the run followed the prefix.
        gains = [(m.prefix + m.run_len) // block_size * block_size - m.prefix // block_size * block_size
                 for m in later]
        runs = [m for m in later if m.run_len]
        reports.append(GroupReport(
            members, min((m.prefix for m in later), default=0),
            round(statistics.median(m.run_start for m in runs)) if runs else 0,
            round(statistics.median(m.run_len for m in runs)) if runs else 0,
            sum(gains) / max(len(members) - 1, 1)))
    return sorted(reports, key=lambda r: (-r.reuse_per_request, r.members[0]))


def read_prompts(path: pathlib.Path, tokenizer: Any) -> list[list[int]]:
    """Token ids of each line: {"prompt": text}, {"messages": [...]} (chat template) or a bare JSON string."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        if isinstance(item, str):
            prompts.append(list(tokenizer.encode(item)))
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(list(tokenizer.encode(item["prompt"])))
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            prompts.append(list(tokenizer.apply_chat_template(
                item["messages"], tokenize=True, add_generation_prompt=True, return_dict=False)))
        else:
            raise ValueError(f'{path}:{number}: expected {{"prompt": ...}}, {{"messages": [...]}} or a string')
    return prompts


def render(reports: list[GroupReport], prompts: list[list[int]], tokenizer: Any,
           prefill_tokens_per_s: float) -> str:
    """The per-group tables and recommendations, as printed."""
    grouped = {i for r in reports for i in r.members}
    lines = [f"{len(prompts)} prompts, {len(reports)} groups sharing content; "
             f"prefill rate {prefill_tokens_per_s:g} tokens/s (an assumption: set --prefill-tokens-per-s to a "
             "measured rate)"]
    for number, r in enumerate(reports, 1):
        first = prompts[r.members[0]]
        snippet = tokenizer.decode(first[r.diverge_at:r.diverge_at + 8])
        saved_ms = r.reuse_per_request / prefill_tokens_per_s * 1000
        lines += [
            "",
            f"group {number}: {len(r.members)} prompts (lines {', '.join(str(i + 1) for i in r.members)})",
            f"  {'diverge at token':<28}{r.diverge_at}  {snippet[:40]!r}",
            f"  {'shared run after it':<28}" + (f"{r.shared_run} tokens from token {r.varying_end}" if r.shared_run
                                                else "none beyond the common prefix"),
            f"  {'reorder reuse per request':<28}~{r.reuse_per_request:.0f} tokens",
            f"  {'prefill saved per request':<28}~{saved_ms:.1f} ms (at the assumed rate)",
        ]
        if r.reuse_per_request >= 1:
            lines.append(f"  recommendation: move the varying part at token {r.diverge_at}-{r.varying_end} after "
                         f"the shared part: ~{r.reuse_per_request:.0f} tokens per request")
        else:
            lines.append(f"  recommendation: none, the shared part is already a common prefix "
                         f"({r.diverge_at} tokens)")
    alone = len(prompts) - len(grouped)
    if alone:
        lines += ["", f"{alone} prompts share no long run with any other"]
    return "\n".join(lines)


def plot(reports: list[GroupReport], path: pathlib.Path, prefill_tokens_per_s: float) -> None:
    """Bar chart of the reuse per request a reordering would bring, per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(reports) + 2), 3.5))
    names = [f"group {i} ({len(r.members)})" for i, r in enumerate(reports, 1)]
    ax.bar(names, [r.reuse_per_request for r in reports], color="tab:blue")
    ax.set_ylabel("tokens per request")
    ax.set_title(f"Prefix-cache reuse a reordering would add (~ms at {prefill_tokens_per_s:g} tok/s, assumed)")
    for i, r in enumerate(reports):
        ax.annotate(f"{r.reuse_per_request / prefill_tokens_per_s * 1000:.0f} ms", (i, r.reuse_per_request),
                    ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def add_advise_arguments(parser: argparse.ArgumentParser) -> None:
    """The `advise` subcommand's arguments."""
    parser.add_argument("prompts", help="JSONL file: one {\"prompt\": ...}, {\"messages\": [...]} or string a line")
    parser.add_argument("--model", default=None, help="whose tokenizer to use (default: embedded SmolLM2-135M)")
    parser.add_argument("--revision", default=None, help="branch, tag or commit of a Hugging Face --model")
    parser.add_argument("--block-size", type=int, default=16, help="KV block size of the engine (default 16)")
    parser.add_argument("--min-shared", type=int, default=32,
                        help="tokens two prompts must share to be grouped (default 32)")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=2000.0,
                        help="assumed prefill rate for the time estimate (default 2000)")
    parser.add_argument("--plot", default=None, help="write a bar chart (PNG) of the reuse per group here")


def advise_main(args: argparse.Namespace) -> int:
    """Tokenize, analyse and print; loads only the model's tokenizer files (compiles nothing)."""
    from transformers import PreTrainedTokenizerFast

    from jaxpaged.weights.loader import locate_model

    for name in ("block_size", "min_shared", "prefill_tokens_per_s"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}: must be positive, got {getattr(args, name)}")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(locate_model(args.model, revision=args.revision)[0]))
    prompts = read_prompts(pathlib.Path(args.prompts), tokenizer)
    reports = analyse(prompts, block_size=args.block_size, min_shared=args.min_shared)
    print(render(reports, prompts, tokenizer, args.prefill_tokens_per_s))
    if args.plot:
        plot(reports, pathlib.Path(args.plot), args.prefill_tokens_per_s)
        print(f"\nwrote {args.plot}")
    return 0
