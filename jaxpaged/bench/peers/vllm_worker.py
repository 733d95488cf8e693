"""The vllm_cpu peer's worker, run by path with the bench environment's python (`make peer-vllm`): vLLM's offline
LLM.generate on the requests jaxpaged's sweep sends it. It imports only the standard library and vLLM (jaxpaged is
not installed there).

    python vllm_worker.py '{"model": DIR, "dtype": "float32", "seed": 0, "engine_args": {...}}'

then one JSON command a line on stdin: {"op": "run", "prompts": [[ids]], "max_tokens": [n], "temperature": t,
"ignore_eos": b} answers one event; {"op": "quit"} ends it. Events go to stdout as lines starting with MARK (vLLM
logs to stdout as well): {"event": "ready", "load_s", "version"} once loaded, then per run {"event": "run",
"duration_s", "outputs": [{"token_ids", "first_token_s", "finish_s"}]} (seconds from the run's start; null where
vLLM does not say), or {"event": "error", "message"}.
"""

import json
import sys
import time
import traceback

MARK = "@jaxpaged-peer "


def emit(event: dict) -> None:
    """One event line for the sweep (flushed at once: the sweep waits on it)."""
    sys.stdout.write(MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def _request_times(output, start_wall: float, start_monotonic: float) -> tuple:
    """(first token, finish) in seconds from the run's start, from vLLM's per-request stats when it keeps them."""
    stats = getattr(output, "metrics", None)
    first = getattr(stats, "first_token_ts", None)
    last = getattr(stats, "last_token_ts", None)
    if first and last:  # the engine's monotonic clock
        return first - start_monotonic, last - start_monotonic
    first = getattr(stats, "first_token_time", None)
    last = getattr(stats, "last_token_time", None) or getattr(stats, "finished_time", None)
    if first and last:  # the wall clock (older RequestMetrics)
        return first - start_wall, last - start_wall
    return None, None


def run(llm, command: dict) -> dict:
    """One measured LLM.generate over the command's requests."""
    from vllm import SamplingParams  # pyright: ignore[reportMissingImports]  (only in the bench environment)

    prompts = [{"prompt_token_ids": list(ids)} for ids in command["prompts"]]
    params = [SamplingParams(temperature=command["temperature"], max_tokens=max_tokens,
                             ignore_eos=command["ignore_eos"], detokenize=False)
              for max_tokens in command["max_tokens"]]
    start_wall, start_monotonic = time.time(), time.monotonic()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    duration_s = time.time() - start_wall
    results = []
    for output in outputs:
        first, finish = _request_times(output, start_wall, start_monotonic)
        results.append({"token_ids": list(output.outputs[0].token_ids), "first_token_s": first, "finish_s": finish})
    return {"event": "run", "duration_s": duration_s, "outputs": results}


def main() -> None:
    """Load once, then answer commands until quit or end of input."""
    spec = json.loads(sys.argv[1])
    start = time.perf_counter()
    import vllm  # pyright: ignore[reportMissingImports]  (only in the bench environment)

    llm = vllm.LLM(model=spec["model"], dtype=spec["dtype"], seed=spec.get("seed", 0), **spec.get("engine_args", {}))
    emit({"event": "ready", "load_s": time.perf_counter() - start, "version": vllm.__version__})
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        if command.get("op") == "quit":
            break
        try:
            emit(run(llm, command))
        except Exception as error:  # the sweep records it as the peer's failure
            emit({"event": "error", "message": f"{type(error).__name__}: {error}\n{traceback.format_exc()}"})


if __name__ == "__main__":  # vLLM's engine core is a spawned process that imports this module again
    main()
