"""A deadline on reading a request body: a client that sends its headers and then trickles (or stops sending) the
body gets 408 and its connection closed, instead of holding a socket and a task for as long as it likes.

uvicorn bounds idle keep-alive connections (timeout_keep_alive) and the number of connections
(limit_concurrency), but not how long a request body may take to arrive; this middleware does.
"""

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jaxpaged.server.http.errors import APIError

DEFAULT_REQUEST_BODY_TIMEOUT_S = 60.0
"""Seconds a request body may take to arrive, counted from its headers (2 MiB at ~35 KB/s)."""


class BodyDeadlineMiddleware:
    """ASGI middleware: the body's messages must all arrive within timeout_s of the request's headers, else the
    route's read raises a 408 APIError (answered as the OpenAI error body, with `Connection: close`)."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_done = False

        async def receive_before_deadline() -> Message:
            nonlocal body_done
            if body_done:
                # NOTE: after the body, receive() only waits for a disconnect, for as long as a response streams.
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(deadline - loop.time(), 0.0))
            except TimeoutError:
                # The rest of the body may still be on its way: only closing the connection frees it.
                raise APIError(408, f"the request body did not arrive within {self.timeout_s:g} s",
                               code="request_timeout", headers={"Connection": "close"}) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, receive_before_deadline, send)
