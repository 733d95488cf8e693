"""Engine options as command-line flags, shared by `serve`, `generate` and `bench`.

Each flag maps to one EngineConfig field; flags left unset keep the config's default.
"""

import argparse

# (flag, type, help). The dest is the EngineConfig field name.
_ENGINE_FLAGS = [
    ("--block-size", int, "tokens per KV block (default 16)"),
    ("--max-model-len", int, "longest prompt + output in tokens (default 2048)"),
    ("--max-num-seqs", int, "most requests running at once (default 64)"),
    ("--max-num-batched-tokens", int, "token budget of one step (default 512)"),
    ("--num-kv-blocks", int, "KV blocks in the pool (default: from --kv-cache-memory)"),
    ("--kv-cache-memory", str, "KV pool size in bytes (default: 1 GiB on CPU, 60%% of free device memory)"),
    ("--dtype", str, "auto | float32 | bfloat16 | float16 (auto: bfloat16 on TPU/GPU; on a CPU the faster of "
                     "float32 and bfloat16 by a start-up probe)"),
    ("--attention-backend", str, "auto | xla | pallas_tpu | pallas_gpu"),
    ("--scheduling-policy", str, "fcfs | priority"),
    ("--long-prefill-token-threshold", int, "cap on one request's prompt tokens per step (0: off)"),
    ("--prefix-caching-granularity", str, "token | block: after full-block prefix hits, also reuse a partly "
                                          "matching block's tokens (token, default) or not (block, as vLLM)"),
    ("--kv-offload-memory", str, "host-memory KV tier size, e.g. 8GiB: blocks the device pool evicts live on there "
                                 "(default 0: off)"),
    ("--kv-offload-dir", str, "local-disk KV tier directory: evicted blocks persist there across restarts "
                              "(default: off)"),
    ("--kv-offload-dir-max-bytes", str, "bound of the disk KV tier, e.g. 100GiB (default 16GiB)"),
    ("--kv-offload-min-load-blocks", int, "recompute lower-tier hits shorter than this many blocks "
                                          "(default: measured at start-up)"),
    ("--seed", int, "base sampler seed for requests without one"),
    ("--compilation-cache-dir", str, "JAX persistent compilation cache ('' turns it off)"),
    ("--tensor-parallel-size", int, "devices each model replica is split over (default 1); alias -tp"),
    ("--data-parallel-size", int, "model replicas, each with its own KV pool and scheduler (default 1); alias -dp"),
]
# vLLM's short forms.
_ALIASES = {"--tensor-parallel-size": "-tp", "--data-parallel-size": "-dp"}


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --model, --revision and every engine option flag to `parser`."""
    parser.add_argument("--model", default=None,
                        help="HF checkpoint dir, .gguf file, converted checkpoint or Hugging Face repo id "
                             "(org/name; fetched through the HF cache) (default: embedded SmolLM2-135M)")
    # Not an engine option: it selects what load_model reads, so engine_options_from_args leaves it out.
    parser.add_argument("--revision", default=None,
                        help="branch, tag or commit of a Hugging Face --model (default: the repo's default branch)")
    group = parser.add_argument_group("engine options")
    for flag, kind, help_text in _ENGINE_FLAGS:
        flags = [flag, _ALIASES[flag]] if flag in _ALIASES else [flag]
        group.add_argument(*flags, type=kind, default=None, help=help_text)
    group.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None,
                       help="turn off prefix caching")
    group.add_argument("--async-scheduling", dest="async_scheduling", action=argparse.BooleanOptionalAction,
                       default=None, help="plan each step while the previous one is on the device (hides host time; "
                                          "default: on, unless the KV tiers or multi-host serving are on)")
    group.add_argument("--advisor-log-text", dest="advisor_log_text", action="store_true", default=None,
                       help="let the prefix-cache advisor's log line quote a short snippet of the prompt")


def engine_options_from_args(args: argparse.Namespace) -> dict:
    """The engine options the user set (unset flags are left out)."""
    names = [flag[2:].replace("-", "_") for flag, _, _ in _ENGINE_FLAGS] + ["enable_prefix_caching", "advisor_log_text",
                                                                   "async_scheduling"]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
