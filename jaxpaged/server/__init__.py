"""The OpenAI-compatible HTTP server (FastAPI + uvicorn): build_app for embedding, serve_main for `jaxpaged serve`."""

from jaxpaged.server.app import build_app
from jaxpaged.server.context import ServerSettings
from jaxpaged.server.launcher import serve_main
from jaxpaged.server.serve_flags import add_serve_arguments

__all__ = ["build_app", "ServerSettings", "add_serve_arguments", "serve_main"]
