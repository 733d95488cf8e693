"""vLLM `serve` flags that jaxpaged has no use for, so that a vLLM launch line runs unedited where that is honest.

  - IGNORED: flags about vLLM's own machinery (logging of requests, eager mode, CPU swap, remote code): accepted,
    each with one warning at start-up saying why it changes nothing here;
  - UNSUPPORTED: flags that would change the served model or its outputs (LoRA, pipeline parallelism): refused
    at parse time, naming the flag, since serving without them would quietly answer differently;
  - --speculative-config: vLLM's JSON, read into the flat speculative engine options (--speculative-method ...).

vLLM flags with a jaxpaged counterpart are real flags elsewhere: the engine options share vLLM's names
(--max-model-len, -tp, --dtype, --seed, --gpu-memory-utilization, --quantization / -q ...) and serve_flags.py has the
server's (--served-model-name, CORS, TLS ...).
Any other unknown flag stays argparse's "unrecognized arguments" error, which names it too.
"""

import argparse
import json
from collections.abc import Sequence
from typing import Any, Optional

from jaxpaged.server.vllm.launch_flags import add_vllm_launch_flags
from jaxpaged.speculative_config import VLLM_SPECULATIVE_KEYS

IGNORED_SWITCHES = {
    "--trust-remote-code": "jaxpaged runs no Python code from a checkpoint; its own model code reads the weights",
    "--disable-log-requests": "requests are not logged unless --enable-log-requests",
    "--enforce-eager": "jaxpaged compiles every bucket at start-up and never compiles while serving",
    "--disable-frontend-multiprocessing": "jaxpaged's server and engine loop share one process",
    "--disable-custom-all-reduce": "jaxpaged's collectives are XLA's",
}
"""vLLM switches accepted with a warning, and why they change nothing here."""

IGNORED_WITH_VALUE = {
    "--swap-space": "jaxpaged preempts by recomputing; host memory holds KV blocks only with --kv-offload-memory",
    "--max-log-len": "jaxpaged does not log prompts",
    "--load-format": "jaxpaged reads safetensors, GGUF and its own checkpoints by their files",
    "--distributed-executor-backend": "jaxpaged runs one process per host through jax.distributed",
}
"""vLLM flags that take a value, accepted with a warning."""

UNSUPPORTED = {
    "--enable-lora": "LoRA adapters",
    "--lora-modules": "LoRA adapters",
    "--pipeline-parallel-size": "pipeline parallelism (use -tp / -dp)",
    "--kv-transfer-config": "disaggregated prefill",
    "--cpu-offload-gb": "offloading weights to the host",
    "--limit-mm-per-prompt": "multimodal inputs",
}
"""vLLM flags refused by name, and the feature jaxpaged lacks."""

_SHORT_FORMS = {"--pipeline-parallel-size": ("-pp",)}
IGNORED_DEST = "vllm_ignored_flags"
"""The namespace attribute listing the ignored flags given (warned about once logging is set up)."""


class _Ignored(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        given = list(getattr(namespace, IGNORED_DEST, None) or [])
        given.append(self.option_strings[0])
        setattr(namespace, IGNORED_DEST, given)


class _Unsupported(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        flag = self.option_strings[0]
        parser.error(f"{flag}: vLLM's flag for {UNSUPPORTED[flag]}, which jaxpaged does not support")


class _SpeculativeConfig(argparse.Action):
    """vLLM's --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, ...}' as the flat options."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        try:
            mapping = json.loads(values)
        except json.JSONDecodeError as error:
            parser.error(f"--speculative-config: not JSON ({error})")
        if not isinstance(mapping, dict):
            parser.error(f"--speculative-config: must be a JSON object, got {values!r}")
        unknown = sorted(set(mapping) - set(VLLM_SPECULATIVE_KEYS))
        if unknown:
            parser.error(f"--speculative-config: unknown keys {unknown}; known: {sorted(VLLM_SPECULATIVE_KEYS)}")
        for key, value in mapping.items():
            setattr(namespace, VLLM_SPECULATIVE_KEYS[key], value)


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the ignored and the refused vLLM flags to `parser` (hidden from --help; docs/vllm-compatibility.md
    lists them)."""
    parser.set_defaults(**{IGNORED_DEST: []})
    for flag in IGNORED_SWITCHES:
        parser.add_argument(flag, nargs=0, action=_Ignored, help=argparse.SUPPRESS)
    for flag in IGNORED_WITH_VALUE:
        parser.add_argument(flag, nargs=1, action=_Ignored, help=argparse.SUPPRESS)
    parser.add_argument("--speculative-config", action=_SpeculativeConfig, metavar="JSON",
                        help="vLLM's speculative_config as JSON (method, num_speculative_tokens, prompt_lookup_min, "
                             "prompt_lookup_max, disable_by_batch_size): the --speculative-* options in one flag")
    add_vllm_launch_flags(parser)
    for flag in UNSUPPORTED:
        # nargs="?": refused the same way as a switch or with a value.
        parser.add_argument(flag, *_SHORT_FORMS.get(flag, ()), nargs="?", action=_Unsupported, help=argparse.SUPPRESS)


def ignored_flag_warnings(flags: Sequence[str]) -> list[str]:
    """One warning line per ignored vLLM flag given, in the order given (each flag once)."""
    reasons = {**IGNORED_SWITCHES, **IGNORED_WITH_VALUE}
    return [f"{flag}: vLLM's flag is accepted and ignored: {reasons[flag]}" for flag in dict.fromkeys(flags)]
