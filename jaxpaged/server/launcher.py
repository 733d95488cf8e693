"""`jaxpaged serve`: flags, engine start-up (compiles before the port opens), uvicorn, graceful SIGTERM.

On SIGTERM the server stops accepting (new work gets 503, the listening socket closes), lets requests in flight
finish (for up to --shutdown-timeout; then they are cancelled), stops the engine loop (persisting the KV cache to
the disk tier for up to --kv-persist-timeout, logging what it left out) and exits 0. If the engine loop fails
instead, the process exits with watchdog.EXIT_ENGINE_FAILED (server/watchdog.py), for an orchestrator to restart it.
"""

import argparse
import gc
import json
import logging
import shlex
import signal
import sys
from typing import Any, Optional

import uvicorn

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.multihost.runtime import is_leader, join_job
from jaxpaged.server import multihost
from jaxpaged.server.app import build_app
from jaxpaged.server.config_file import CONFIG_MODEL_DEST
from jaxpaged.server.context import ServerContext
from jaxpaged.server.openai.chat_template import check_chat_template
from jaxpaged.server.parsers.reasoning import check_reasoning_markers
from jaxpaged.server.serve_flags import API_KEY_ENV, settings_from_args, uvicorn_options
from jaxpaged.server.stats_log import StatsLogger
from jaxpaged.server.vllm.flags import IGNORED_DEST, ignored_flag_warnings
from jaxpaged.server.vllm.launch_flags import (
    apply_download_flags,
    logged_flag_lines,
    loopback_note,
    override_sampling_defaults,
)
from jaxpaged.server.watchdog import fail_stop_on_engine_failure

logger = logging.getLogger(__name__)


class _GracefulServer(uvicorn.Server):
    """uvicorn.Server that marks the app as draining (503, /health not ready) as soon as a signal arrives."""

    def __init__(self, config: uvicorn.Config, context: ServerContext) -> None:
        super().__init__(config)
        self._context = context

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._context.draining = True
        super().handle_exit(sig, frame)


def _curl_example(host: str, port: int, model_name: str, needs_key: bool, scheme: str = "http") -> str:
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    body = json.dumps({"model": model_name, "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 32})
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if needs_key else ""  # never the key itself
    return (f"curl {scheme}://{shown_host}:{port}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f"-d {shlex.quote(body)}")


def model_argument(args: argparse.Namespace) -> Optional[str]:
    """The model to serve: the positional MODEL (vLLM's `serve MODEL`) or --model; both, if they differ, is a
    ValueError naming them."""
    positional, flag = getattr(args, "model_path", None), getattr(args, "model", None)
    if positional is not None and flag is not None and positional != flag:
        raise ValueError(f"model: given twice, as MODEL ({positional!r}) and --model ({flag!r}); give one")
    if positional is None and flag is None:  # the --config file's `model:`, the command line's model beating it
        return getattr(args, CONFIG_MODEL_DEST, None)
    return positional if positional is not None else flag


def serve_main(args: argparse.Namespace) -> int:
    """Builds the engine, serves until SIGTERM/SIGINT, drains, and returns the exit code (0).

    Multi-host: every process runs this; process 0 serves, the others follow it (server/multihost.py).
    """
    from jaxpaged.cli_options import engine_options_from_args
    from jaxpaged.config import EngineConfig
    from jaxpaged.engine import LLMEngine
    from jaxpaged.features.wiring import followers_of
    from jaxpaged.kv_events_config import kv_events_on_http_host

    for line in ignored_flag_warnings(getattr(args, IGNORED_DEST, None) or []):
        logger.warning("%s", line)
    for line in logged_flag_lines(args):
        logger.info("%s", line)
    try:
        apply_download_flags(args)
        args.model = model_argument(args)
        settings = settings_from_args(args)
        server_options = uvicorn_options(args)
        engine_options = engine_options_from_args(args)
        if engine_options.get("kv_events_config") is not None:  # no endpoint: bind where HTTP listens, not on *
            engine_options["kv_events_config"] = kv_events_on_http_host(engine_options["kv_events_config"], args.host)
        config = EngineConfig.from_options(**engine_options)
        join_job(config.multihost)
        if not is_leader():
            code = multihost.follow(args, config)
            if code:
                multihost.exit_at_once(code)
            return code
        engine = LLMEngine.from_options(model=args.model, revision=getattr(args, "revision", None), **engine_options)
        engine.sampling_defaults = override_sampling_defaults(engine.sampling_defaults,
                                                              getattr(args, "override_generation_config", None))
        check_chat_template(engine.tokenizer, settings.chat_template)
        check_reasoning_markers(settings.reasoning_parser, engine.tokenizer, settings.chat_template)
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
    else:
        fail_stop_on_engine_failure(async_engine)
    async_engine.start()
    stats_logger = None if getattr(args, "disable_log_stats", False) else StatsLogger(async_engine.get_stats).start()
    # NOTE: the engine is stopped below, not by the app's shutdown, so that its persist gets its own time bound.
    app = build_app(async_engine, settings)
    server = _GracefulServer(uvicorn.Config(app, **server_options), app.state.context)
    scheme, model_name = ("https" if "ssl_certfile" in server_options else "http"), app.state.context.model_name
    print(f"jaxpaged: serving {model_name} on {scheme}://{args.host}:{args.port} "
          f"(OpenAI API under /v1; /health, /metrics){loopback_note(args.host)}\n  try: "
          f"{_curl_example(args.host, args.port, model_name, settings.api_key is not None, scheme)}",
          flush=True)
    # NOTE: uvicorn re-raises a caught SIGTERM once it has shut down, to exit "as killed". The drain already
    # happened, so the re-raised signal meets a no-op handler and the process exits 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if stats_logger is not None:
            stats_logger.stop()
        async_engine.shutdown(timeout_s=args.kv_persist_timeout)
    return 0 if server.started else 1
