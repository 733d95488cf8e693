"""Bearer-token auth: every route but /health, /metrics and /version needs `Authorization: Bearer <key>`.

An allow-list of open paths (rather than a list of protected prefixes) keeps any route added later protected.
"""

import hashlib
import hmac

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from jaxpaged.server.errors import error_body

OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})
"""Paths that stay reachable without the key (probes and scrapers)."""


def _digest(value: bytes) -> bytes:
    # NOTE: comparing fixed-length digests keeps even the key's length out of the timing.
    return hashlib.sha256(value).digest()


class BearerAuthMiddleware:
    """ASGI middleware answering 401 (OpenAI error body) unless the request carries the right bearer token."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected_digest = _digest(f"Bearer {api_key}".encode())

    def is_authorized(self, authorization: bytes) -> bool:
        """Constant-time check of an Authorization header value."""
        return hmac.compare_digest(_digest(authorization), self._expected_digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
                break
        if self.is_authorized(authorization):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(error_body(401, "missing or invalid API key (send Authorization: Bearer <key>)",
                                           code="invalid_api_key"),
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
