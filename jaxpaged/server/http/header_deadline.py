"""A deadline on request headers: uvicorn closes idle keep-alive connections, but a client that opens a connection
and sends nothing, or its headers a byte at a time ("slowloris"), holds the socket for good, and every such socket
counts against --limit-concurrency. This protocol closes a connection whose next request's headers are not complete
within --request-header-timeout of its opening or of its last response.

A subclass of uvicorn's h11 protocol (the one uvicorn picks without httptools), relying on three of its members:
`cycle` (the request in progress, or None), `cycle.response_complete`, and `on_response_complete`.
"""

import asyncio
from typing import Any, Optional

from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_REQUEST_HEADER_TIMEOUT_S = 30.0
"""Seconds a connection may take to send a request's headers."""


class _HeaderDeadlineH11Protocol(H11Protocol):
    """H11Protocol that closes a connection still waiting for a request's headers after header_timeout_s."""

    header_timeout_s: float = DEFAULT_REQUEST_HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: Optional[asyncio.TimerHandle] = None
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()  # the next request's headers get their own time

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_deadline)

    def _on_header_deadline(self) -> None:
        self._header_timer = None
        # NOTE: a request whose headers arrived in time is in progress: its body has its own deadline
        # (body_deadline.py) and its response may stream for as long as it needs.
        waiting_for_headers = self.cycle is None or self.cycle.response_complete
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()


def header_deadline_protocol(timeout_s: float) -> type[H11Protocol]:
    """The protocol class to give uvicorn.Config as `http`, closing connections whose headers take over timeout_s."""
    attributes: dict[str, Any] = {"header_timeout_s": timeout_s}
    return type("HeaderDeadlineH11Protocol", (_HeaderDeadlineH11Protocol,), attributes)
