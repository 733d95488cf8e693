"""How long issue 56's structured-output attacks stall other clients' streams: a live server on a tiny model, streams
running back to back, each attack sent while one runs; prints the largest gap between two tokens of a stream while
each attack was being answered (target: under 250 ms), beside the largest gap with no attack.

    python -m benchmarks.hostile.grammar_stall [--model DIR] [--max-tokens 200]

Without --model a seeded random 2-layer Llama with SmolLM2's vocabulary is written to a temporary directory (the test
suite's tiny model). Not a test: the figures depend on the machine.
"""

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from tests.hostile.live_server import LiveServer


def ref_chain(length: int = 1200) -> dict:
    """$defs d0..d<length-1>, each an array of the next (the schema that segfaulted llguidance)."""
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(length)}
    defs[f"d{length}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def properties(count: int) -> dict:
    """An object schema with `count` integer properties."""
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(count)}}


def attacks() -> list[tuple[str, str, dict]]:
    """(name, path, body) of each attack, the largest constraints the limits still let through, and plain requests of
    the same shape (what admitting any request costs the stream)."""
    chat = {"messages": [{"role": "user", "content": "Call the tool."}], "max_tokens": 8}
    done = {"prompt": "Answer:", "max_tokens": 8, "temperature": 0}
    tools = [{"type": "function", "function": {"name": "deep", "parameters": ref_chain()}}]
    return [
        ("$defs chain, structured_outputs.json", "/v1/completions",
         {**done, "structured_outputs": {"json": ref_chain()}}),
        ("$defs chain, guided_json", "/v1/completions", {**done, "guided_json": ref_chain()}),
        ("$defs chain, tool parameters", "/v1/chat/completions", {**chat, "tools": tools, "tool_choice": "required"}),
        ("60,000-string choice", "/v1/completions",
         {**done, "structured_outputs": {"choice": [f"option-{i:05d}-abcdefgh" for i in range(60_000)]}}),
        ("10,000 properties, n=8", "/v1/completions", {**done, "n": 8, "guided_json": properties(10_000)}),
        ("regex (a{1000}){1000}", "/v1/completions", {**done, "structured_outputs": {"regex": "(a{1000}){1000}"}}),
        ("10,000-string choice (the limit)", "/v1/completions",
         {**done, "structured_outputs": {"choice": [f"option-{i:05d}-abcdefgh" for i in range(10_000)]}}),
        ("1,000 properties, n=8 (the limit)", "/v1/completions", {**done, "n": 8, "guided_json": properties(1_000)}),
        ("400 properties, n=8", "/v1/completions", {**done, "n": 8, "guided_json": properties(400)}),
        ("control: no constraint, n=1", "/v1/completions", done),
        ("control: no constraint, n=8", "/v1/completions", {**done, "n": 8}),
    ]


class StreamWatch:
    """Streams one completion after another on a thread, keeping (previous token time, token time) of every gap."""

    def __init__(self, server: LiveServer, max_tokens: int) -> None:
        self.server = server
        self.max_tokens = max_tokens
        self.gaps: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "StreamWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(60)

    def gap_stats(self, start: float, end: float) -> Optional[tuple[float, float, int]]:
        """(largest gap ms, 99th percentile ms, gaps over 250 ms) of the gaps that overlap [start, end]; None if no
        stream token came in that window."""
        overlapping = sorted(1e3 * (after - before) for before, after in list(self.gaps)
                             if after >= start and before <= end)
        if not overlapping:
            return None
        p99 = overlapping[min(len(overlapping) - 1, int(0.99 * len(overlapping)))]
        return round(overlapping[-1]), round(p99), sum(gap > 250 for gap in overlapping)

    def _run(self) -> None:
        body = {"prompt": "Once upon a time", "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True}
        while not self._stop.is_set():
            last = None
            with httpx.stream("POST", self.server.base_url + "/v1/completions", json=body,
                              headers=self.server.headers, timeout=600) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.monotonic()
                    if last is not None:
                        self.gaps.append((last, now))
                    last = now
                    if self._stop.is_set():
                        break


def main() -> None:
    assert __doc__ is not None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the tiny random Llama)")
    parser.add_argument("--max-tokens", type=int, default=200, help="tokens per watched stream")
    parser.add_argument("--quiet-s", type=float, default=30.0, help="how long the no-attack baseline watches")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(args.model) if args.model else tiny_model(Path(scratch))
        flags = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
        with LiveServer(model, Path(scratch) / "server.log", *flags) as server, \
                StreamWatch(server, args.max_tokens) as watch:
            time.sleep(3.0)
            quiet_start = time.monotonic()
            time.sleep(args.quiet_s)
            rows = [(f"no attack ({args.quiet_s:g} s)", "-", watch.gap_stats(quiet_start, time.monotonic()), 0.0)]
            for name, path, body in attacks():
                start = time.monotonic()
                response = server.post(path, body, timeout=600)
                end = time.monotonic()
                time.sleep(0.3)  # the gap that ends after the answer still counts
                rows.append((name, f"{response.status_code}", watch.gap_stats(start, end + 0.3), end - start))
            server.assert_still_serving()
    print(f"{'attack':<40} {'status':>6} {'answered in':>11} {'largest gap':>11} {'p99 gap':>8} {'>250ms':>6}")
    for name, status, gaps, seconds in rows:
        largest, p99, num_over = ("-", "-", "-") if gaps is None else (f"{gaps[0]} ms", f"{gaps[1]} ms", gaps[2])
        print(f"{name:<40} {status:>6} {seconds:>10.2f}s {largest:>11} {p99:>8} {num_over:>6}")
    print(json.dumps({name: gaps for name, _, gaps, _ in rows}))


def tiny_model(directory: Path) -> Path:
    """The test suite's tiny random Llama over SmolLM2's tokenizer, written into `directory`."""
    # tests.conftest first: it refuses to load after jaxpaged's models (its jaxtyping hook must see them load).
    from tests.conftest import TINY_LLAMA, save_tiny_llama  # isort: skip
    from jaxpaged.weights.loader import locate_model  # isort: skip

    return save_tiny_llama(directory / "tiny-llama", locate_model(None)[0], TINY_LLAMA)


if __name__ == "__main__":
    main()
