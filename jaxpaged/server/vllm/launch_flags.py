"""More of `vllm serve`'s flags, each doing here what it does in vLLM, or saying at start-up why it need not.

  - --enable-chunked-prefill / --no-enable-chunked-prefill: jaxpaged always chunks prefills (a step's
    max_num_batched_tokens bounds them), so both are logged once and change nothing;
  - --generation-config auto: the model's generation_config.json sets the sampling defaults, as here always;
    "vllm" or a folder is refused, naming the flag. --override-generation-config JSON: those defaults, overridden;
  - --kv-cache-memory-bytes 8G: the KV pool per device, vLLM's human-readable int (our --kv-cache-memory);
  - --default-chat-template-kwargs JSON: chat_template_kwargs every chat request starts from;
  - --download-dir, --hf-token: where Hugging Face downloads go, and the token they use;
  - --structured-outputs-config JSON: its `enable_in_reasoning` (a grammar also holds inside the reasoning, not only
    after it); its other keys choose vLLM's machinery (one backend here), logged once. --max-logprobs: logged once.
"""

import argparse
import json
import os
from typing import Any, Optional

from jaxpaged.vllm_values import human_readable_int

LOGGED_SWITCHES = {
    "--enable-chunked-prefill": "jaxpaged always chunks long prefills (max_num_batched_tokens bounds a step)",
    "--no-enable-chunked-prefill": "jaxpaged always chunks long prefills and cannot turn it off; "
                                   "raise --max-num-batched-tokens for fewer, larger chunks",
}
LOGGED_WITH_VALUE = {
    "--max-logprobs": "jaxpaged allows up to 20 logprobs per token (the OpenAI limit)",
}
STRUCTURED_OUTPUTS_REASON = "jaxpaged has one structured-output backend, its own grammar compiler"
LOGGED_DEST = "vllm_logged_flags"
"""The namespace attribute listing (flag, reason) pairs to log once logging is set up."""


class _Logged(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        flag = option_string or self.option_strings[0]
        reason = {**LOGGED_SWITCHES, **LOGGED_WITH_VALUE}[flag]
        setattr(namespace, LOGGED_DEST, [*(getattr(namespace, LOGGED_DEST, None) or []), (flag, reason)])


class _StructuredOutputsConfig(argparse.Action):
    """--structured-outputs-config JSON: enable_in_reasoning is honoured; the backend keys are logged once."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        config = _json_object("structured_outputs_config")(values)
        in_reasoning = config.get("enable_in_reasoning", False)
        if not isinstance(in_reasoning, bool):
            parser.error(f"--structured-outputs-config: enable_in_reasoning must be true or false, got "
                         f"{in_reasoning!r}")
        namespace.structured_outputs_in_reasoning = in_reasoning
        if set(config) - {"enable_in_reasoning"}:
            setattr(namespace, LOGGED_DEST, [*(getattr(namespace, LOGGED_DEST, None) or []),
                                             ("--structured-outputs-config", STRUCTURED_OUTPUTS_REASON)])


def _json_object(flag: str):
    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
        return value

    parse.__name__ = flag
    return parse


def _kv_cache_bytes(text: str) -> int:
    try:
        return human_readable_int(text, "kv_cache_memory_bytes")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _generation_config(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(
            f"jaxpaged supports only 'auto' (the model's generation_config.json sets the sampling defaults; "
            f"--override-generation-config changes them), got {text!r}")
    return text


def add_vllm_launch_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the flags of this module to `parser` (hidden from --help; docs/vllm-compatibility.md lists them)."""
    parser.set_defaults(**{LOGGED_DEST: []})
    for flag in LOGGED_SWITCHES:
        parser.add_argument(flag, nargs=0, action=_Logged, help=argparse.SUPPRESS)
    for flag in LOGGED_WITH_VALUE:
        parser.add_argument(flag, nargs=1, action=_Logged, help=argparse.SUPPRESS)
    parser.add_argument("--structured-outputs-config", action=_StructuredOutputsConfig, metavar="JSON",
                        help="vLLM's: {\"enable_in_reasoning\": true} lets a grammar hold inside a thinking model's "
                             "reasoning too (default: only after it); other keys are vLLM's backends, logged")
    parser.add_argument("--kv-cache-memory-bytes", dest="kv_cache_memory", type=_kv_cache_bytes,
                        help="vLLM's: the KV pool per device in bytes (8G = 8 GiB, 8g = 8e9): --kv-cache-memory")
    parser.add_argument("--generation-config", type=_generation_config, default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--override-generation-config", type=_json_object("override_generation_config"),
                        default=None, metavar="JSON",
                        help="sampling defaults over the model's generation_config.json, as JSON "
                             "('{\"temperature\": 0.5}')")
    parser.add_argument("--default-chat-template-kwargs", type=_json_object("default_chat_template_kwargs"),
                        default=None, metavar="JSON",
                        help="chat_template_kwargs every chat request starts from ('{\"enable_thinking\": false}')")
    parser.add_argument("--disable-log-stats", action="store_true",
                        help="no stats line every 10 s (throughput, running, waiting, KV cache usage, prefix hits)")
    parser.add_argument("--enable-log-requests", action="store_true",
                        help="log one line per request: its id, prompt length and sampling parameters")
    parser.add_argument("--download-dir", default=None, help="where Hugging Face downloads go (default: its cache)")
    parser.add_argument("--hf-token", nargs="?", const=True, default=None,
                        help="the Hugging Face token for downloads (no value: the one `hf auth login` stored)")


def logged_flag_lines(args: argparse.Namespace) -> list[str]:
    """One line per logged vLLM flag given (each flag once)."""
    pairs = dict(getattr(args, LOGGED_DEST, None) or [])
    return [f"{flag}: vLLM's flag is accepted and changes nothing here: {reason}" for flag, reason in pairs.items()]


def apply_download_flags(args: argparse.Namespace) -> None:
    """Points Hugging Face downloads at --download-dir and --hf-token (both read when a download starts)."""
    token = getattr(args, "hf_token", None)
    if isinstance(token, str):
        os.environ["HF_TOKEN"] = token
    directory = getattr(args, "download_dir", None)
    if directory is not None:
        from huggingface_hub import constants

        os.environ["HF_HUB_CACHE"] = directory
        constants.HF_HUB_CACHE = directory


def override_sampling_defaults(defaults: dict[str, Any], override: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The model's sampling defaults with --override-generation-config's on top; ValueError naming a key that is
    no sampling default."""
    from jaxpaged.weights.generation_config import OVERRIDABLE_SAMPLING_FIELDS

    if not override:
        return defaults
    unknown = sorted(set(override) - set(OVERRIDABLE_SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"override_generation_config: unknown keys {unknown}; known: "
                         f"{', '.join(OVERRIDABLE_SAMPLING_FIELDS)}")
    return {**defaults, **override}


def loopback_note(host: str) -> str:
    """What the start-up line adds when the server listens on loopback only (vLLM's default is every address,
    so a vLLM user expects other machines to reach it)."""
    if host == "localhost" or host == "::1" or host.startswith("127."):
        return f"; {host} is loopback only: other machines cannot connect (--host 0.0.0.0 listens on every address)"
    return ""
