"""Per-chunk cost of streaming tool-call parsing at 1k, 16k and 128k characters of output (issue 56, finding 7).

A chat stream with tool_choice "auto" hands its parser the text so far at every step. Before, the parser re-read
the whole text each time (issue 56 measured 27.8 ms a chunk at 128k characters, hermes, on the event loop); now a
scanner per stream keeps its place. For each parser and length this primes one stream to that length, then times
the next chunks (4 characters each, about a token): median and mean per chunk (the mean includes the chunks that
complete a call, whose JSON is decoded then); beside it, what re-reading the whole text at that length costs (a
fresh scanner over it, which is the work main did at every chunk).

    python -m benchmarks.hostile.tool_stream_cost [--chunks 400]
"""

import argparse
import json
import platform
import statistics
import time

from jaxpaged.server.openai.chat_text import ChoiceText
from jaxpaged.server.openai.tool_calls import ToolCalling
from jaxpaged.server.parsers.tool import make_tool_parser
from jaxpaged.server.parsers.tool.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, SEP

LENGTHS = (1_000, 16_000, 128_000)
CHUNK_CHARS = 4


def _hermes_call(index: int) -> str:
    arguments = {"city": f"Paris {index}", "days": [1, 2, 3], "units": {"temperature": "C"}}
    return f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': arguments})}\n</tool_call>\n"


def _deepseek_call(index: int) -> str:
    return (f"{CALL_BEGIN}function{SEP}get_weather\n```json\n"
            f'{json.dumps({"city": f"Paris {index}", "days": [1, 2]})}\n```{CALL_END}')


def output_of(name: str, num_chars: int) -> str:
    """Prose, then calls in `name`'s format, to at least num_chars characters."""
    text, index = "Let me look that up. " * 4 + (CALLS_BEGIN if name == "deepseek_v3" else ""), 0
    while len(text) < num_chars:
        text += (_hermes_call if name == "hermes" else _deepseek_call)(index)
        index += 1
    return text


def cpu_model() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def per_chunk_ms(name: str, length: int, num_chunks: int) -> tuple[float, float, float]:
    """(median and mean ms per chunk of a stream at `length` characters, ms to re-read the whole text there)."""
    text = output_of(name, length + CHUNK_CHARS * num_chunks)
    parser = make_tool_parser(name)
    assert parser is not None
    choice = ChoiceText(ToolCalling([], None, parser), None, False)
    choice.delta(text[:length], False)  # primes the stream: everything up to `length` read once
    times = []
    for end in range(length + CHUNK_CHARS, length + CHUNK_CHARS * num_chunks + 1, CHUNK_CHARS):
        prefix = text[:end]  # the engine's cumulative text, as a stream receives it (not timed)
        start = time.perf_counter()
        choice.delta(prefix, False)
        times.append(time.perf_counter() - start)
    prefix = text[:length]
    start = time.perf_counter()
    for _ in range(20):
        parser.scanner().advance(prefix)
    whole_ms = (time.perf_counter() - start) / 20 * 1e3
    return statistics.median(times) * 1e3, statistics.mean(times) * 1e3, whole_ms


def main() -> None:
    """Prints a table: parser, length, per-chunk ms (median, mean), whole-text re-read ms."""
    arguments = argparse.ArgumentParser(description="Per-chunk cost of streaming tool-call parsing.")
    arguments.add_argument("--chunks", type=int, default=400, help="chunks timed per length")
    options = arguments.parse_args()
    print(f"Python {platform.python_version()} on {cpu_model()}")
    print(f"{'parser':<12} {'chars':>8} {'chunk median (ms)':>18} {'chunk mean (ms)':>16} {'whole re-read (ms)':>19}")
    for name in ("hermes", "deepseek_v3"):
        for length in LENGTHS:
            median_ms, mean_ms, whole_ms = per_chunk_ms(name, length, options.chunks)
            print(f"{name:<12} {length:>8} {median_ms:>18.4f} {mean_ms:>16.4f} {whole_ms:>19.3f}")


if __name__ == "__main__":
    main()
