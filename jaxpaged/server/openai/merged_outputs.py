"""The outputs of several engine requests (a completion with several prompts) as one stream, coalesced per request.

Each request's RequestStream already keeps only its newest output. Merging them through a queue undid that: a
client that stops reading a streamed batch completion left every step's snapshot of every prompt queued, without
bound (issue 56, finding 9). Here each request has one pending slot that a newer output replaces (outputs are
cumulative: the newest says everything the older ones did), so however far the reader lags it holds at most one
output per request, as the single-prompt stream does.
"""

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Sequence
from typing import Optional

from jaxpaged.outputs import RequestOutput


class LatestOutputs:
    """Per request, its newest output not yet read; a reader waits on next()."""

    def __init__(self, num_requests: int) -> None:
        self._pending: dict[int, RequestOutput] = {}  # NOTE: a replaced output keeps its place in line
        self._error: Optional[BaseException] = None
        self._num_open = num_requests
        self._ready = asyncio.Event()

    @property
    def num_pending(self) -> int:
        """Outputs waiting for the reader: at most one per request."""
        return len(self._pending)

    def put(self, index: int, output: RequestOutput) -> None:
        """Request `index` has a newer output (it replaces one the reader has not taken)."""
        self._pending[index] = output
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        """A request's stream failed: the reader gets the error once it has taken what is pending."""
        if self._error is None:
            self._error = error
        self._ready.set()

    def end(self) -> None:
        """One request's stream has ended (after its last put or its failure)."""
        self._num_open -= 1
        self._ready.set()

    async def next(self) -> Optional[tuple[int, RequestOutput]]:
        """(request index, its newest output), requests in the order they became pending; raises a stream's
        error; None once every stream ended and everything was read."""
        while True:
            if self._pending:
                index = next(iter(self._pending))
                return index, self._pending.pop(index)
            if self._error is not None:
                raise self._error
            if self._num_open == 0:
                return None
            self._ready.clear()
            await self._ready.wait()


async def merged_outputs(streams: Sequence[AsyncIterable[RequestOutput]]
                         ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """(request index, newest output) from every stream (the RequestStreams of one HTTP request), at most one
    pending per stream."""
    latest = LatestOutputs(len(streams))
    pumps = [asyncio.ensure_future(_pump(index, stream, latest)) for index, stream in enumerate(streams)]
    try:
        while (item := await latest.next()) is not None:
            yield item
    finally:
        for pump in pumps:
            pump.cancel()


async def _pump(index: int, stream: AsyncIterable[RequestOutput], latest: LatestOutputs) -> None:
    try:
        async for output in stream:
            latest.put(index, output)
    except Exception as error:
        latest.fail(error)
    finally:
        latest.end()
