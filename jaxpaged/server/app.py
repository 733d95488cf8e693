"""build_app: the FastAPI app of the OpenAI-compatible server around one AsyncLLMEngine.

Routes parse their own bodies (openai/validation.py) rather than through FastAPI's body parameters, so that size,
encoding, NaN and schema errors all come back as OpenAI error bodies with status 400 / 413, never 422.
"""

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import jaxpaged
from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.server.context import ServerContext, ServerSettings
from jaxpaged.server.http.auth import BearerAuthMiddleware
from jaxpaged.server.http.body_deadline import BodyDeadlineMiddleware
from jaxpaged.server.http.errors import error_body, install_error_handlers
from jaxpaged.server.http.host_guard import AllowedHostsMiddleware
from jaxpaged.server.metrics import ServerMetrics
from jaxpaged.server.openai.chat import create_chat_completion
from jaxpaged.server.openai.completions import create_completion
from jaxpaged.server.openai.responses_endpoint import create_response
from jaxpaged.server.openai.tokenization import detokenize, tokenize
from jaxpaged.server.vllm.lora_adapters import install_lora_routes, load_lora_modules, model_cards


def build_app(engine: AsyncLLMEngine, settings: Optional[ServerSettings] = None, *,
              owns_engine: bool = False) -> FastAPI:
    """The app; with owns_engine the app's shutdown (after uvicorn drained the requests) stops the engine loop."""
    settings = settings or ServerSettings()
    model_name = (settings.served_model_names or (engine.model_name,))[0]
    context = ServerContext(engine=engine, settings=settings, metrics=ServerMetrics(engine, model_name))
    load_lora_modules(context.lora_adapters, settings.lora_modules, context.model_names)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        context.draining = True
        if owns_engine:
            engine.shutdown()

    app = FastAPI(title="jaxpaged", version=jaxpaged.__version__, lifespan=lifespan)
    app.state.context = context
    install_error_handlers(app)
    app.add_middleware(BodyDeadlineMiddleware, timeout_s=settings.request_body_timeout_s)
    if settings.api_key is not None or settings.metrics_key is not None:
        app.add_middleware(BearerAuthMiddleware, api_key=settings.api_key, metrics_key=settings.metrics_key,
                           metrics_open=settings.metrics_open)
    if settings.allowed_origins:
        # NOTE: added last, so it wraps the auth middleware: a browser's preflight OPTIONS carries no key.
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                           allow_methods=list(settings.allowed_methods), allow_headers=list(settings.allowed_headers),
                           allow_credentials=settings.allow_credentials)
    if settings.allowed_hosts:
        # NOTE: outermost: a rebound name is refused before CORS or auth look at the request.
        app.add_middleware(AllowedHostsMiddleware, allowed_hosts=list(settings.allowed_hosts))

    context.metrics.instrument_http(app)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await create_completion(request, context)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await create_chat_completion(request, context)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await create_response(request, context)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        cards = [{"id": name, "object": "model", "created": created, "owned_by": "jaxpaged", "root": engine.model_name,
                  "parent": None, "max_model_len": engine.max_model_len} for name in context.model_names]
        cards += model_cards(context.lora_adapters, context.model_name, created)
        return JSONResponse({"object": "list", "data": cards})

    install_lora_routes(app, context)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> JSONResponse:
        return await tokenize(request, context)

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> JSONResponse:
        return await detokenize(request, context)

    @app.get("/health")
    async def health() -> Response:
        if context.ready:
            stalled_s = engine.seconds_without_progress
            if stalled_s > settings.engine_step_timeout_s:  # a hung step: the loop lives but serves nobody
                return JSONResponse(error_body(503, f"no engine step has finished for {stalled_s:.0f} s while requests "
                                                    f"are pending (--engine-step-timeout)", code="engine_stalled"),
                                    status_code=503)
            return JSONResponse({"status": "ok"})
        message = "the server is shutting down" if context.draining else "the engine loop is not running"
        return JSONResponse(error_body(503, message, code="unavailable"), status_code=503)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": jaxpaged.__version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(context.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
