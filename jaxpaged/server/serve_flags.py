"""The flags of `jaxpaged serve` besides the engine options, with vLLM's names where vLLM has the flag, and the
ServerSettings and uvicorn options they make."""

import argparse
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Union

from jaxpaged.logging_setup import LOG_LEVELS
from jaxpaged.server.context import DEFAULT_MAX_PROMPTS_PER_REQUEST, DEFAULT_MAX_REQUEST_BODY_BYTES, ServerSettings
from jaxpaged.server.http.body_deadline import DEFAULT_REQUEST_BODY_TIMEOUT_S
from jaxpaged.server.http.header_deadline import DEFAULT_REQUEST_HEADER_TIMEOUT_S, header_deadline_protocol
from jaxpaged.server.openai.chat_template import load_chat_template
from jaxpaged.server.parsers.reasoning import REASONING_PARSERS
from jaxpaged.server.parsers.tool import TOOL_CALL_PARSERS
from jaxpaged.server.vllm.flags import add_vllm_flags
from jaxpaged.server.vllm.lora_modules import parse_lora_module
from jaxpaged.server.watchdog import DEFAULT_ENGINE_STEP_TIMEOUT_S

logger = logging.getLogger(__name__)

API_KEY_ENV = "JAXPAGED_API_KEY"
"""Environment variable read when --api-key is not given."""
VLLM_API_KEY_ENV = "VLLM_API_KEY"
"""vLLM's variable, read when neither --api-key nor $JAXPAGED_API_KEY is given (a vLLM manifest must not serve
without its key)."""
METRICS_KEY_ENV = "JAXPAGED_METRICS_KEY"
"""Environment variable read when --metrics-key is not given."""
PORT_ENV = "JAXPAGED_PORT"
"""Environment variable that sets --port's default (the container image's entry point and health check share it)."""
DEFAULT_PORT = 8000
DEFAULT_LIMIT_CONCURRENCY = 2048
"""uvicorn's limit_concurrency: open connections (idle ones too) beyond which new requests get 503."""
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 5
"""uvicorn's timeout_keep_alive: an idle keep-alive connection is closed after this many seconds."""
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
"""On SIGTERM, seconds requests in flight may take to finish before uvicorn cancels them."""
DEFAULT_KV_PERSIST_TIMEOUT_S = 30.0
"""After the drain, seconds the engine may take to stop, persisting the KV cache to the disk tier."""


def _add_if_absent(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    # The CLI may already have added a shared flag (say --model) to this subparser.
    if not any(flag in parser._option_string_actions for flag in flags):
        parser.add_argument(*flags, **kwargs)


def _json_list(text: str) -> list[str]:
    """A CORS flag's value as vLLM takes it: a JSON list of strings ('["*"]')."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings such as '[\"*\"]', got {text!r}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise argparse.ArgumentTypeError(f"must be a JSON list of non-empty strings, got {text!r}")
    return value


def _port(text: str) -> int:
    """A TCP port number (from --port or $JAXPAGED_PORT)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 0..65535 (from --port or ${PORT_ENV}), got {text!r}")
    return port


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the serve flags, and --model plus the engine flags unless the caller added them already."""
    from jaxpaged.cli_options import add_engine_arguments

    if "--max-model-len" not in parser._option_string_actions:
        add_engine_arguments(parser)
    _add_if_absent(parser, "--model", default=None,
                   help="HF checkpoint dir or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    _add_if_absent(parser, "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    # NOTE: a str default goes through type=_port, so a bad $JAXPAGED_PORT is a usage error naming --port.
    _add_if_absent(parser, "--port", type=_port, default=os.environ.get(PORT_ENV) or str(DEFAULT_PORT),
                   help=f"port to listen on (default: ${PORT_ENV} if set, else {DEFAULT_PORT})")
    _add_if_absent(parser, "--api-key", nargs="+", default=None, metavar="KEY",
                   help=f"require `Authorization: Bearer KEY` on /v1/*, /tokenize, /detokenize and /metrics; with "
                        f"several keys, any of them (default: ${API_KEY_ENV}, else ${VLLM_API_KEY_ENV}, if set)")
    _add_if_absent(parser, "--metrics-key", default=None,
                   help=f"/metrics takes this bearer key (a Prometheus scrape job's token) instead of the API key, "
                        f"so tenants sharing the API key cannot read it (default: ${METRICS_KEY_ENV} if set)")
    _add_if_absent(parser, "--metrics-open", action="store_true",
                   help="serve /metrics without a key even with --api-key. Its prefix-cache counters let a client "
                        "recover other clients' prompts token by token: only where no tenant can reach the port")
    _add_if_absent(parser, "--max-queued-requests", "--max-num-queued-reqs", type=int,
                   default=ServerSettings.max_queued_requests,
                   help="answer 429 (with Retry-After) when more sequences than this would wait for an engine slot "
                        "(default: no limit)")
    _add_if_absent(parser, "--max-n", type=int, default=ServerSettings.max_n,
                   help="largest n (choices per prompt) a request may ask for")
    _add_if_absent(parser, "--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                   help="answer 413 to larger request bodies (default 2 MiB)")
    _add_if_absent(parser, "--max-prompts-per-request", type=int, default=DEFAULT_MAX_PROMPTS_PER_REQUEST,
                   help=f"answer 400 to a request that would start more sequences (prompts in a batch times n) "
                        f"(default {DEFAULT_MAX_PROMPTS_PER_REQUEST})")
    _add_limit_flags(parser)
    _add_if_absent(parser, "--log-level", default="info", choices=list(LOG_LEVELS),
                   help="log level of jaxpaged (start-up plan, dtype choice) and uvicorn, on stderr")
    parser.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                        help="the model, as vLLM's `serve MODEL` takes it (the same as --model)")
    _add_model_flags(parser.add_argument_group("model and chat (vLLM's flags)"))
    _add_http_flags(parser.add_argument_group("HTTP: CORS, TLS, logging (vLLM's flags)"))
    add_vllm_flags(parser)


def _add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """Slow clients, connections, shutdown and the engine watchdog."""
    _add_if_absent(parser, "--request-body-timeout", type=float, default=DEFAULT_REQUEST_BODY_TIMEOUT_S,
                   metavar="SECONDS", help=f"answer 408 and close the connection when a request body takes longer "
                                           f"to arrive (default {DEFAULT_REQUEST_BODY_TIMEOUT_S:g})")
    _add_if_absent(parser, "--request-header-timeout", type=float, default=DEFAULT_REQUEST_HEADER_TIMEOUT_S,
                   metavar="SECONDS", help=f"close a connection that has not sent a request's headers this long after "
                                           f"it opened or after its last response "
                                           f"(default {DEFAULT_REQUEST_HEADER_TIMEOUT_S:g})")
    _add_if_absent(parser, "--limit-concurrency", type=int, default=DEFAULT_LIMIT_CONCURRENCY,
                   help=f"uvicorn answers 503 to new requests while this many connections are open "
                        f"(default {DEFAULT_LIMIT_CONCURRENCY})")
    _add_if_absent(parser, "--timeout-keep-alive", type=int, default=DEFAULT_TIMEOUT_KEEP_ALIVE_S, metavar="SECONDS",
                   help=f"close idle keep-alive connections after this long (default {DEFAULT_TIMEOUT_KEEP_ALIVE_S})")
    _add_if_absent(parser, "--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S, metavar="SECONDS",
                   help=f"on SIGTERM, cancel the requests still running after this long "
                        f"(default {DEFAULT_SHUTDOWN_TIMEOUT_S:g})")
    _add_if_absent(parser, "--kv-persist-timeout", type=float, default=DEFAULT_KV_PERSIST_TIMEOUT_S,
                   metavar="SECONDS", help=f"after the drain, stop persisting the KV cache to the disk tier after "
                                           f"this long, logging what was left out "
                                           f"(default {DEFAULT_KV_PERSIST_TIMEOUT_S:g})")
    _add_if_absent(parser, "--engine-step-timeout", type=float, default=DEFAULT_ENGINE_STEP_TIMEOUT_S,
                   metavar="SECONDS", help=f"/health answers 503 when no engine step has finished for this long while "
                                           f"requests are pending (default {DEFAULT_ENGINE_STEP_TIMEOUT_S:g})")


def _add_model_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="the names requests may give as `model` (/v1/models lists them; responses and /metrics "
                            "carry the first) (default: the model's name)")
    group.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                       help="LoRA adapters (PEFT directories) served from start-up, each a valid `model`: name=path "
                            "or vLLM's JSON '{\"name\": ..., \"path\": ..., \"base_model_name\": ...}' (needs "
                            "--enable-lora)")
    group.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                       help="a Jinja chat template, as a file or inline, used instead of the model's own")
    group.add_argument("--tool-call-parser", default=None, metavar="NAME",
                       help=f"parse the model's own tool-call syntax, so tool_choice \"auto\" works: "
                            f"{', '.join(TOOL_CALL_PARSERS)}")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="let the model choose to call tools (tool_choice \"auto\"); needs --tool-call-parser")
    group.add_argument("--return-tokens-as-token-ids", action="store_true",
                       help="logprobs spell every token \"token_id:<id>\" (vLLM's flag; a request may ask alone)")
    group.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                       help="tool_choice \"none\" renders the prompt without the tools (default: they stay in it)")
    group.add_argument("--enable-prompt-tokens-details", action="store_true",
                       help="put usage.prompt_tokens_details.cached_tokens in responses (off: the prefix cache is "
                            "shared by clients without a cache_salt, and the count would show another's prompt)")
    group.add_argument("--reasoning-parser", default=None, metavar="NAME",
                       help=f"put a thinking model's <think> text in `reasoning`: {', '.join(REASONING_PARSERS)}")


def _add_http_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--allowed-origins", type=_json_list, default=None, metavar="JSON",
                       help="CORS: origins allowed to call from a browser, a JSON list ('[\"*\"]' for any) "
                            "(default: no CORS headers)")
    group.add_argument("--allowed-methods", type=_json_list, default=None, metavar="JSON",
                       help="CORS: allowed methods, a JSON list (default '[\"*\"]')")
    group.add_argument("--allowed-headers", type=_json_list, default=None, metavar="JSON",
                       help="CORS: allowed request headers, a JSON list (default '[\"*\"]')")
    group.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    group.add_argument("--allowed-hosts", type=_json_list, default=None, metavar="JSON",
                       help="answer 400 unless the Host header names one of these hosts, a JSON list such as "
                            "'[\"localhost\", \"127.0.0.1\", \"*.example.com\"]' (against DNS rebinding) "
                            "(default: any host)")
    group.add_argument("--ssl-keyfile", default=None, help="TLS: the private key file (with --ssl-certfile)")
    group.add_argument("--ssl-certfile", default=None, help="TLS: the certificate file; serves https")
    group.add_argument("--ssl-ca-certs", default=None, help="TLS: CA certificates to verify clients with")
    group.add_argument("--ssl-cert-reqs", type=int, default=0,
                       help="TLS: whether clients need a certificate (Python's ssl.CERT_*: 0 none, 2 required)")
    group.add_argument("--root-path", default=None, help="the path prefix a proxy serves the app under")
    group.add_argument("--uvicorn-log-level", default=None, choices=[*LOG_LEVELS, "trace"],
                       help="uvicorn's log level (default: --log-level)")
    group.add_argument("--disable-uvicorn-access-log", action="store_true", help="no access log line per request")


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """ServerSettings from parsed flags (the API key from the environment when the flag is absent); ValueError
    naming the flag for a bad combination or a chat template file that does not exist."""
    api_key = api_key_from(args.api_key, os.environ)
    metrics_key = getattr(args, "metrics_key", None) or os.environ.get(METRICS_KEY_ENV) or None
    if getattr(args, "metrics_open", False) and api_key is not None and metrics_key is None:
        logger.warning("--metrics-open: /metrics answers without a key; its prefix-cache counters let any client "
                       "that reaches it recover other clients' prompts (docs/server.md#metrics-and-the-api-key)")
    cors: dict[str, Any] = {}
    if getattr(args, "allowed_origins", None):
        cors = {"allowed_origins": tuple(args.allowed_origins), "allow_credentials": args.allow_credentials,
                **{name: tuple(getattr(args, name)) for name in ("allowed_methods", "allowed_headers")
                   if getattr(args, name, None) is not None}}
    elif getattr(args, "allowed_methods", None) or getattr(args, "allowed_headers", None) \
            or getattr(args, "allow_credentials", False):
        raise ValueError("allowed_origins: --allowed-methods, --allowed-headers and --allow-credentials take effect "
                         "with --allowed-origins; give it too")
    return ServerSettings(api_key=api_key, metrics_key=metrics_key, metrics_open=getattr(args, "metrics_open", False),
                          max_queued_requests=args.max_queued_requests, max_n=args.max_n,
                          max_request_body_bytes=args.max_request_body_bytes,
                          max_prompts_per_request=args.max_prompts_per_request,
                          request_body_timeout_s=args.request_body_timeout,
                          engine_step_timeout_s=args.engine_step_timeout,
                          tool_call_parser=getattr(args, "tool_call_parser", None),
                          enable_auto_tool_choice=getattr(args, "enable_auto_tool_choice", False),
                          return_tokens_as_token_ids=getattr(args, "return_tokens_as_token_ids", False),
                          structured_outputs_in_reasoning=getattr(args, "structured_outputs_in_reasoning", False),
                          exclude_tools_when_tool_choice_none=getattr(args, "exclude_tools_when_tool_choice_none",
                                                                      False),
                          reasoning_parser=getattr(args, "reasoning_parser", None),
                          enable_prompt_tokens_details=getattr(args, "enable_prompt_tokens_details", False),
                          served_model_names=tuple(getattr(args, "served_model_name", None) or ()),
                          lora_modules=tuple(parse_lora_module(text) for text in getattr(args, "lora_modules", None)
                                             or ()),
                          allowed_hosts=tuple(getattr(args, "allowed_hosts", None) or ()),
                          chat_template=load_chat_template(getattr(args, "chat_template", None)),
                          default_chat_template_kwargs=getattr(args, "default_chat_template_kwargs", None),
                          log_requests=getattr(args, "enable_log_requests", False), **cors)


def api_key_from(flag: Union[str, list[str], None], environ: Mapping[str, str]) -> Union[str, tuple[str, ...], None]:
    """The API key(s): --api-key's, else $JAXPAGED_API_KEY, else $VLLM_API_KEY (jaxpaged's own variable wins, with a
    warning, when both are set and differ)."""
    if flag:
        keys = (flag,) if isinstance(flag, str) else tuple(flag)
        return keys[0] if len(keys) == 1 else keys
    own, vllms = environ.get(API_KEY_ENV) or None, environ.get(VLLM_API_KEY_ENV) or None
    if own is not None and vllms is not None and own != vllms:
        logger.warning("$%s and $%s are both set and differ: $%s is the key", API_KEY_ENV, VLLM_API_KEY_ENV,
                       API_KEY_ENV)
    return own or vllms


def uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn.Config's keyword options from the flags (address, TLS, logging, root path, connection limits and
    timeouts); ValueError naming the flag for TLS files that are missing or given alone, or a limit out of range."""
    options: dict[str, Any] = dict(host=args.host, port=args.port,
                                   log_level=getattr(args, "uvicorn_log_level", None) or args.log_level,
                                   timeout_graceful_shutdown=args.shutdown_timeout,
                                   limit_concurrency=args.limit_concurrency, timeout_keep_alive=args.timeout_keep_alive)
    for flag, value, minimum in (("limit_concurrency", args.limit_concurrency, 1),
                                 ("timeout_keep_alive", args.timeout_keep_alive, 1),
                                 ("shutdown_timeout", args.shutdown_timeout, 0),
                                 ("kv_persist_timeout", args.kv_persist_timeout, 0)):
        if not value >= minimum:  # NaN too
            raise ValueError(f"{flag}: --{flag.replace('_', '-')} must be >= {minimum}, got {value}")
    if not args.request_header_timeout > 0:
        raise ValueError(f"request_header_timeout: --request-header-timeout must be > 0, "
                         f"got {args.request_header_timeout}")
    options["http"] = header_deadline_protocol(args.request_header_timeout)
    if getattr(args, "disable_uvicorn_access_log", False):
        options["access_log"] = False
    if getattr(args, "root_path", None):
        options["root_path"] = args.root_path
    keyfile, certfile = getattr(args, "ssl_keyfile", None), getattr(args, "ssl_certfile", None)
    if keyfile is not None and certfile is None:
        raise ValueError("ssl_certfile: --ssl-keyfile needs --ssl-certfile")
    for name, path in (("ssl_keyfile", keyfile), ("ssl_certfile", certfile),
                       ("ssl_ca_certs", getattr(args, "ssl_ca_certs", None))):
        if path is not None:
            if not os.path.isfile(path):
                raise ValueError(f"{name}: --{name.replace('_', '-')} {path!r} is not a file")
            options[name] = path
    if certfile is not None:
        options["ssl_cert_reqs"] = getattr(args, "ssl_cert_reqs", 0)
    return options
