"""Server-sent events and client disconnects: whatever way a client leaves, its engine requests are aborted."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

SSE_DONE = "data: [DONE]\n\n"
"""The last event of every OpenAI stream."""


def sse_event(payload: Any) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before its response was ready."""


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that calls on_close when it ends for any reason.

    Starlette cancels the body iterator when the client disconnects; an async generator cancelled before its
    first step never runs its own `finally`, so the cleanup hangs on the response instead.
    """

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _wait_for_disconnect(request: Request) -> None:
    # NOTE: the body has been read in full, so the next ASGI message can only be http.disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits work, but cancels it and raises ClientDisconnected as soon as the client goes away."""
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work_task in done:
            return work_task.result()
        raise ClientDisconnected()
    finally:
        for task in (work_task, watcher):
            task.cancel()
