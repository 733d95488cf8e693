"""One request's outputs between the engine's loop thread and an asyncio caller: the slot the loop fills
(OutputSink) and the async iterator the caller reads (RequestStream)."""

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Union

from jaxpaged.outputs import RequestOutput


class OutputSink:
    """Where the loop thread delivers one request's outputs: one slot that keeps the newest (outputs are
    cumulative, so it says all the older ones did) and a wake-up for the reader on the caller's event loop, sent
    only when none is pending. However far a reader lags, its stream holds one output, and the loop thread pays one
    call_soon_threadsafe per reader wake-up, not per step."""

    def __init__(self, loop: asyncio.AbstractEventLoop, num_seqs: int) -> None:
        self.loop = loop
        self.num_seqs = num_seqs
        self.released = False  # guarded by the AsyncLLMEngine's lock
        self._lock = threading.Lock()
        self._latest: Union[RequestOutput, BaseException, None] = None  # guarded by _lock
        self._wake_pending = False  # guarded by _lock
        self._ready = asyncio.Event()  # touched on the caller's loop only

    def deliver(self, item: Union[RequestOutput, BaseException]) -> bool:
        """Hands an output (or the error that ends the stream) over; False when the caller's loop is gone."""
        if not self.put(item):
            return True
        try:
            self.loop.call_soon_threadsafe(self.wake)
            return True
        except RuntimeError:  # the event loop was closed: nobody is listening any more
            return False

    def put(self, item: Union[RequestOutput, BaseException]) -> bool:
        """deliver() without the wake-up: True when the reader needs one (wake(), on its loop)."""
        with self._lock:
            self._latest = item
            wake, self._wake_pending = not self._wake_pending, True
        return wake

    def wake(self) -> None:
        """Wakes the reader (call on the caller's loop)."""
        self._ready.set()

    async def next(self) -> Union[RequestOutput, BaseException]:
        """The newest item, waiting for one if none came since the last call."""
        while True:
            with self._lock:
                item, self._latest = self._latest, None
                self._wake_pending = False
            if item is not None:
                return item
            # Runs on the caller's loop, like the scheduled set(): no set() can slip between the check and here.
            self._ready.clear()
            await self._ready.wait()


class RequestStream:
    """One request's outputs as an async iterator; closing it before the end aborts the request."""

    def __init__(self, abort: Callable[[str], None], request_id: str, sink: OutputSink,
                 added: concurrent.futures.Future) -> None:
        """abort: the engine's abort (by request id), called when the stream is closed before its end."""
        self.request_id = request_id
        self._abort = abort
        self._sink = sink
        self._added = added
        self._finished = False
        self._closed = False

    async def wait_added(self) -> None:
        """Waits until the engine accepted the request; re-raises its ValueError if it refused it."""
        await asyncio.wrap_future(self._added)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished or self._closed:
            raise StopAsyncIteration
        item = await self._sink.next()
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        self._finished = item.finished
        return item

    @property
    def finished(self) -> bool:
        """Whether the final output has been read."""
        return self._finished

    def close(self) -> None:
        """Aborts the request unless it already finished (idempotent; safe from any state)."""
        if self._closed:
            return
        self._closed = True
        if not self._finished:
            self._abort(self.request_id)
