"""Bearer-token auth: every route but /health and /version needs `Authorization: Bearer <key>`.

/metrics needs a key too, because its prefix-cache counters are an oracle: a client that diffs
vllm:prefix_cache_hits_total while it sends guesses learns, token by token, the prompts other clients sent without a
cache_salt (the same leak usage.prompt_tokens_details closes by default). It takes the API key, or its own
metrics key when one is set (then only that one, so the tenants sharing the API key cannot read it); it stays open
only with an explicit metrics_open (--metrics-open).

An allow-list of open paths (rather than a list of protected prefixes) keeps any route added later protected.
"""

import hashlib
import hmac
from typing import Optional, Union

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from jaxpaged.server.http.errors import error_body

OPEN_PATHS = frozenset({"/health", "/version"})
"""Paths that stay reachable without a key (probes)."""
METRICS_PATH = "/metrics"
"""The scrape path: the metrics key's, or else the API key's."""


def _digest(value: bytes) -> bytes:
    # NOTE: comparing fixed-length digests keeps even the key's length out of the timing.
    return hashlib.sha256(value).digest()


def _bearer_digests(key: Union[str, tuple[str, ...], None]) -> Optional[tuple[bytes, ...]]:
    # Several keys (vLLM's --api-key k1 k2): any of them is accepted.
    if key is None:
        return None
    return tuple(_digest(f"Bearer {one}".encode()) for one in ((key,) if isinstance(key, str) else key))


class BearerAuthMiddleware:
    """ASGI middleware answering 401 (OpenAI error body) unless the request carries the right bearer token for its
    path: the API key (api_key None: those routes are open), and for /metrics the metrics key if set, else the API
    key, unless metrics_open."""

    def __init__(self, app: ASGIApp, api_key: Union[str, tuple[str, ...], None], metrics_key: Optional[str] = None,
                 metrics_open: bool = False) -> None:
        if metrics_open and metrics_key is not None:
            raise ValueError("metrics_open: --metrics-open and --metrics-key contradict each other; give one")
        self.app = app
        self._expected_digest = _bearer_digests(api_key)
        self._metrics_digest = None if metrics_open else (_bearer_digests(metrics_key) or self._expected_digest)

    def is_authorized(self, authorization: bytes, path: str = "") -> bool:
        """Constant-time check of an Authorization header value for `path` (default: an API route)."""
        expected = self._expected_for(path)
        if expected is None:
            return True
        given = _digest(authorization)
        # Every key is compared (no early exit), so the timing does not say which one matched.
        return sum(hmac.compare_digest(given, digest) for digest in expected) > 0

    def _expected_for(self, path: str) -> Optional[tuple[bytes, ...]]:
        if path == METRICS_PATH:
            return self._metrics_digest
        return None if path in OPEN_PATHS else self._expected_digest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._expected_for(scope["path"]) is None:
            await self.app(scope, receive, send)
            return
        authorization = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
                break
        if self.is_authorized(authorization, scope["path"]):
            await self.app(scope, receive, send)
            return
        message = ("missing or invalid key for /metrics (send Authorization: Bearer <the metrics key, or else the "
                   "API key>)" if scope["path"] == METRICS_PATH
                   else "missing or invalid API key (send Authorization: Bearer <key>)")
        response = JSONResponse(error_body(401, message, code="invalid_api_key"),
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

