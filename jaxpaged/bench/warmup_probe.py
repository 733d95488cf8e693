"""Warm-up time of a fresh process: cold (empty persistent compilation cache) and warm (a second start on it).

Each start is its own process, as a restarted server would be:
    python -m jaxpaged.bench.warmup_probe '{"model": null, "engine_options": {...}}'
prints one JSON line {"startup_s", "warmup_s", "num_compilations"}.
"""

import json
import subprocess
import sys
import tempfile
import time
from typing import Optional


def probe_once(model: Optional[str], engine_options: dict, cache_dir: str, timeout_s: float = 1800.0) -> dict:
    """Start an engine in a child process with `cache_dir` as its compilation cache; its start-up figures."""
    spec = json.dumps({"model": model, "engine_options": {**engine_options, "compilation_cache_dir": cache_dir}})
    completed = subprocess.run([sys.executable, "-m", "jaxpaged.bench.warmup_probe", spec], capture_output=True,
                               text=True, timeout=timeout_s)
    if completed.returncode != 0:
        raise RuntimeError(f"warm-up probe failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def probe_cold_and_warm(model: Optional[str], engine_options: dict) -> dict:
    """{"cold": ..., "warm": ...}: two process starts sharing one initially empty compilation cache."""
    with tempfile.TemporaryDirectory(prefix="jaxpaged-xla-cache-") as cache_dir:
        cold = probe_once(model, engine_options, cache_dir)
        warm = probe_once(model, engine_options, cache_dir)
    return {"cold": cold, "warm": warm}


def main() -> int:
    """Child side: build the engine, report how long it took."""
    spec = json.loads(sys.argv[1])
    start = time.perf_counter()
    from jaxpaged.engine import LLMEngine

    engine = LLMEngine.from_options(spec["model"], **spec["engine_options"])
    startup_s = time.perf_counter() - start
    stats = engine.get_stats()
    print(json.dumps({"startup_s": startup_s, "warmup_s": stats.warmup_seconds,
                      "num_compilations": stats.num_compilations}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
