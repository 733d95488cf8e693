"""`jaxpaged serve`: flags, engine start-up (compiles before the port opens), uvicorn, graceful SIGTERM.

On SIGTERM the server stops accepting (new work gets 503, the listening socket closes), lets requests in flight
finish, stops the engine loop and exits 0.
"""

import argparse
import gc
import json
import logging
import os
import shlex
import signal
import sys
from typing import Any, Optional

import uvicorn

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.logging_setup import LOG_LEVELS
from jaxpaged.multihost.runtime import add_distributed_arguments, is_leader, options_from_args
from jaxpaged.server import multihost
from jaxpaged.server.app import build_app
from jaxpaged.server.context import DEFAULT_MAX_REQUEST_BODY_BYTES, ServerContext, ServerSettings
from jaxpaged.server.tool_parsers import TOOL_CALL_PARSERS

API_KEY_ENV = "JAXPAGED_API_KEY"
"""Environment variable read when --api-key is not given."""

logger = logging.getLogger(__name__)


def _add_if_absent(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    # The CLI may already have added a shared flag (say --model) to this subparser.
    if not any(flag in parser._option_string_actions for flag in flags):
        parser.add_argument(*flags, **kwargs)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the serve flags, and --model plus the engine flags unless the caller added them already."""
    from jaxpaged.cli_options import add_engine_arguments

    if "--max-model-len" not in parser._option_string_actions:
        add_engine_arguments(parser)
    _add_if_absent(parser, "--model", default=None,
                   help="HF checkpoint dir or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    _add_if_absent(parser, "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    _add_if_absent(parser, "--port", type=int, default=8000, help="port to listen on (default 8000)")
    _add_if_absent(parser, "--api-key", default=None,
                   help=f"require `Authorization: Bearer KEY` on /v1/*, /tokenize, /detokenize "
                        f"(default: ${API_KEY_ENV} if set)")
    _add_if_absent(parser, "--max-queued-requests", type=int, default=ServerSettings.max_queued_requests,
                   help="answer 429 when more sequences than this would wait for an engine slot")
    _add_if_absent(parser, "--max-n", type=int, default=ServerSettings.max_n,
                   help="largest n (choices per prompt) a request may ask for")
    _add_if_absent(parser, "--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                   help="answer 413 to larger request bodies (default 2 MiB)")
    _add_if_absent(parser, "--tool-call-parser", default=None, choices=list(TOOL_CALL_PARSERS),
                   help='parse the model\'s own tool-call syntax, so tool_choice "auto" works (hermes: Hermes, '
                        'Qwen 2.5 / 3 <tool_call> blocks)')
    _add_if_absent(parser, "--log-level", default="info", choices=list(LOG_LEVELS),
                   help="log level of jaxpaged (start-up plan, dtype choice) and uvicorn, on stderr")
    parser.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                        help="the model, as vLLM's `serve MODEL` takes it (the same as --model)")
    if "--coordinator-address" not in parser._option_string_actions:
        add_distributed_arguments(parser)


class _GracefulServer(uvicorn.Server):
    """uvicorn.Server that marks the app as draining (503, /health not ready) as soon as a signal arrives."""

    def __init__(self, config: uvicorn.Config, context: ServerContext) -> None:
        super().__init__(config)
        self._context = context

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._context.draining = True
        super().handle_exit(sig, frame)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """ServerSettings from parsed flags (the API key from the environment when the flag is absent)."""
    api_key = args.api_key if args.api_key else os.environ.get(API_KEY_ENV) or None
    return ServerSettings(api_key=api_key, max_queued_requests=args.max_queued_requests, max_n=args.max_n,
                          max_request_body_bytes=args.max_request_body_bytes,
                          tool_call_parser=getattr(args, "tool_call_parser", None))


def _curl_example(host: str, port: int, model_name: str, needs_key: bool) -> str:
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    body = json.dumps({"model": model_name, "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 32})
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if needs_key else ""  # never the key itself
    return (f"curl http://{shown_host}:{port}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d {shlex.quote(body)}")


def model_argument(args: argparse.Namespace) -> Optional[str]:
    """The model to serve: the positional MODEL (vLLM's `serve MODEL`) or --model; both, if they differ, is a
    ValueError naming them."""
    positional, flag = getattr(args, "model_path", None), getattr(args, "model", None)
    if positional is not None and flag is not None and positional != flag:
        raise ValueError(f"model: given twice, as MODEL ({positional!r}) and --model ({flag!r}); give one")
    return positional if positional is not None else flag


def serve_main(args: argparse.Namespace) -> int:
    """Builds the engine, serves until SIGTERM/SIGINT, drains, and returns the exit code (0).

    Multi-host: every process runs this; process 0 serves, the others follow it (server/multihost.py).
    """
    from jaxpaged.cli_options import engine_options_from_args
    from jaxpaged.engine import LLMEngine
    from jaxpaged.features.wiring import followers_of

    try:
        args.model = model_argument(args)
        settings = settings_from_args(args)
        distributed = options_from_args(args)
        multihost.join_job(distributed)
        if not is_leader():
            code = multihost.follow(args, distributed)
            if code:
                multihost.exit_at_once(code)
            return code
        engine = LLMEngine.from_options(model=args.model, revision=getattr(args, "revision", None),
                                        distributed_timeout_s=distributed.timeout_s, **engine_options_from_args(args))
    except (ValueError, FileNotFoundError) as error:
        print(f"jaxpaged serve: {error}", file=sys.stderr)
        return 2
    # Everything alive now (modules, JAX's caches, the weights' host copies, the tokenizer, the compiled programs)
    # lives as long as this process: out of the collector's sight, a full collection while serving walks only
    # what serving made. At 512 running requests one took 116 ms before, 4 ms after (docs/performance.md): a
    # stall of every stream. Here and not in LLMEngine: a process that builds several engines (tests, notebooks)
    # would never collect the cycles the earlier ones leave.
    gc.collect()
    gc.freeze()
    async_engine = AsyncLLMEngine(engine)
    followers = followers_of(engine.features)
    if followers is not None:
        multihost.fail_stop_on_lost_follower(async_engine, followers)
    async_engine.start()
    app = build_app(async_engine, settings, owns_engine=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=None)
    server = _GracefulServer(config, app.state.context)
    print(f"jaxpaged: serving {async_engine.model_name} on http://{args.host}:{args.port} "
          f"(OpenAI API under /v1; /health, /metrics)\n  try: "
          f"{_curl_example(args.host, args.port, async_engine.model_name, settings.api_key is not None)}",
          flush=True)
    # NOTE: uvicorn re-raises a caught SIGTERM once it has shut down, to exit "as killed". The drain already
    # happened, so the re-raised signal meets a no-op handler and the process exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        async_engine.shutdown()
    return 0 if server.started else 1
