"""--allowed-hosts: refuse requests whose Host header names no allowed host (DNS rebinding).

A page on evil.example whose name is rebound to 127.0.0.1 reaches a local server with `Host: evil.example`; checking
the Host header is what keeps it from reading the answers. Starlette's TrustedHostMiddleware decides which hosts
match (ports stripped, IPv6 brackets, `*.example.com` wildcards); this wrapper only answers its refusal as an OpenAI
error body instead of Starlette's plain text.
"""

from collections.abc import Sequence

from fastapi.responses import JSONResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jaxpaged.server.http.errors import error_body

_ADMITTED = "jaxpaged.host_admitted"
"""Scope key the inner checker sets when the Host header matched."""


def check_host_patterns(patterns: Sequence[str]) -> None:
    """ValueError naming allowed_hosts for a pattern TrustedHostMiddleware would refuse (a `*` not leading `*.`)."""
    for pattern in patterns:
        if not pattern or "*" in pattern[1:] or (pattern.startswith("*") and pattern != "*"
                                                 and not pattern.startswith("*.")):
            raise ValueError(f"allowed_hosts: a host is a name, an address, '*.example.com' or '*', got {pattern!r}")


async def _admit(scope: Scope, receive: Receive, send: Send) -> None:
    scope[_ADMITTED] = True


async def _discard(message: Message) -> None:
    """Swallows Starlette's own plain-text refusal; the wrapper sends the OpenAI body instead."""


class AllowedHostsMiddleware:
    """ASGI middleware answering 400 (OpenAI error body) to a request whose Host is not allowed."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        check_host_patterns(allowed_hosts)
        self.app = app
        # NOTE: www_redirect off: a redirect to www.<host> would send the client somewhere nobody allowed.
        self._checker = TrustedHostMiddleware(_admit, allowed_hosts=list(allowed_hosts), www_redirect=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        await self._checker(scope, receive, _discard)
        if scope.pop(_ADMITTED, False):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(error_body(400, "the Host header names no host in the server's --allowed-hosts",
                                           code="invalid_host"), status_code=400)
        await response(scope, receive, send)
