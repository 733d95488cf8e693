"""vLLM's LLM(...) keyword options read as jaxpaged's engine options, as `jaxpaged serve` reads vLLM's flags.

LLM("x", trust_remote_code=True) is vLLM's usual line: the keys a vLLM flag accepts and ignores here are dropped
with one log line; vLLM's spellings (kv_cache_memory_bytes="8G", max_model_len="32k", dtype="half") become the
engine options; a key that is a server option of `jaxpaged serve` (host, api_key ...) is a ValueError naming it,
since LLM serves nothing. Other unknown keys are left to EngineConfig, whose error names them.
"""

import logging
from typing import Any

logger = logging.getLogger(__name__)

_IGNORED = {
    "trust_remote_code": "jaxpaged runs no Python code from a checkpoint",
    "enforce_eager": "jaxpaged compiles every bucket at start-up",
    "swap_space": "jaxpaged preempts by recomputing",
    "disable_custom_all_reduce": "jaxpaged's collectives are XLA's",
    "disable_log_stats": "LLM logs no periodic stats",
    "enable_chunked_prefill": "jaxpaged always chunks long prefills",
    "load_format": "jaxpaged reads safetensors, GGUF and its own checkpoints by their files",
    "distributed_executor_backend": "jaxpaged runs one process per host through jax.distributed",
}
"""vLLM's LLM keys that change nothing here, and why."""
_RENAMED = {"kv_cache_memory_bytes": "kv_cache_memory"}


def engine_options_from_vllm(options: dict[str, Any]) -> dict[str, Any]:
    """`options` with vLLM's ignored keys dropped (logged), its names and spellings made jaxpaged's; ValueError
    naming a key that only `jaxpaged serve` takes."""
    from jaxpaged.cli_options import engine_options
    from jaxpaged.vllm_values import human_readable_int

    known = engine_options()
    result = {}
    for key, value in options.items():
        if key in _IGNORED:
            logger.info("LLM(%s=...): vLLM's option is accepted and changes nothing here: %s", key, _IGNORED[key])
            continue
        if key == "kv_cache_memory_bytes" and isinstance(value, str):
            value = human_readable_int(value, key)
        name = _RENAMED.get(key, key)
        if name in known and isinstance(value, str) and (name == "max_model_len" or known[name].choices):
            value = known[name].parse(value)  # "32k", "auto", "half": as the flag reads them
            if value is None:  # max_model_len "auto": the default
                continue
        if name not in known and name not in ("speculative_config",) and name in _serve_only_keys():
            raise ValueError(f"{key}: a server option of `jaxpaged serve`, not an engine option of LLM(...)")
        result[name] = value
    return result


def _serve_only_keys() -> set[str]:
    """The dests of `jaxpaged serve`'s flags that are no engine options (host, port, api_key ...)."""
    import argparse

    from jaxpaged.cli_options import engine_options
    from jaxpaged.server.serve_flags import add_serve_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_serve_arguments(parser)
    return {action.dest for action in parser._actions} - set(engine_options()) - {"model", "model_path", "revision"}
