"""How far a quantized KV cache (EngineConfig.kv_cache_dtype "int8" / "fp8_e4m3") moves a model's greedy choices,
measured as greedy_agreement.py measures int8 weights: the model with its KV in dtype generates greedily; then the
quantized-KV model reads prompt + that continuation (teacher-forced, one prefill with prompt logprobs) and a position
agrees when the unquantized model's token is its argmax. Also free-running: its own greedy continuation against the
unquantized one's.

    python -m benchmarks.quantization.kv_agreement [--model PATH] [--kv-cache-dtype int8] [--num-tokens 64]
"""

import argparse
import json
import time
from typing import Any, Optional

from benchmarks.quantization.greedy_agreement import (
    ENGINE_OPTIONS,
    PROMPTS,
    common_prefix,
    continuations,
    histogram,
    share,
    teacher_forced,
)
from jaxpaged.bench.machine_info import describe_machine, load_average, machine_info
from jaxpaged.llm import LLM


def measure(model: Optional[str], kv_cache_dtype: str, num_tokens: int, dtype: str) -> dict[str, Any]:
    """Every figure of one run (see the module docstring)."""
    started = time.time()
    unquantized = LLM(model, dtype=dtype, **ENGINE_OPTIONS)
    pairs = continuations(unquantized, num_tokens)
    del unquantized
    quantized = LLM(model, dtype=dtype, kv_cache_dtype=kv_cache_dtype, **ENGINE_OPTIONS)
    scored = teacher_forced(quantized, pairs)
    own_pairs = continuations(quantized, num_tokens)
    prefixes = [common_prefix(ours[1], theirs[1]) for ours, theirs in zip(own_pairs, pairs)]
    return {
        "model": model or "SmolLM2-135M-Instruct (embedded)", "dtype": dtype, "kv_cache_dtype": kv_cache_dtype,
        "kv_bytes_per_token": quantized.engine.runner.memory_plan.kv_bytes_per_token,
        "num_prompts": len(PROMPTS), "num_tokens": num_tokens, "machine": describe_machine(machine_info()),
        "load_average": load_average(), "seconds": round(time.time() - started, 1),
        "teacher_forced_agreement": share(scored), "rank_histogram": histogram(scored),
        "free_running_identical_sequences": sum(p == num_tokens for p in prefixes),
        "free_running_mean_common_prefix": sum(prefixes) / len(prefixes),
    }


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--kv-cache-dtype", default="int8", choices=("int8", "fp8", "fp8_e4m3"))
    parser.add_argument("--num-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.model, args.kv_cache_dtype, args.num_tokens, args.dtype), indent=1))


if __name__ == "__main__":
    main()
