"""uvicorn's h11 HTTP protocol with a deadline for request headers (slow-client guard).

uvicorn closes idle keep-alive connections after ``timeout_keep_alive``, but a connection that
opens and then sends nothing, or sends its headers a byte at a time, is held forever (each one
costs a file descriptor, so a thousand of them lock everyone out). This protocol closes a
connection whose request headers are not complete ``header_timeout`` seconds after it opened
or after its previous response ended. Headers that grow past uvicorn's
``h11_max_incomplete_event_size`` are refused by h11 itself (400), which is why this server
uses the h11 protocol rather than httptools.

Use it as ``uvicorn.run(app, http="atroposlib.api.http_protocol:HeaderTimeoutH11Protocol")``
after :func:`set_header_timeout`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeaderTimeoutH11Protocol", "set_header_timeout"]


class HeaderTimeoutH11Protocol(H11Protocol):
    """H11Protocol that closes connections whose request headers take too long.

    The deadline runs from the connection's opening (and again from the end of each response)
    until a full request head has arrived; bytes trickling in do not extend it.
    """

    #: Seconds a connection may take to send a complete request head.
    header_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timer_expired)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timer_expired(self) -> None:
        self._header_timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the header deadline as the connection opens."""
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        """Parse as uvicorn does; stop the deadline once a request head is complete."""
        super().data_received(data)
        if self._in_request():
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        """Restart the deadline for the next request on this connection."""
        super().on_response_complete()
        if not self.transport.is_closing() and not self._in_request():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._disarm_header_timer()
        super().connection_lost(exc)


def set_header_timeout(seconds: float) -> None:
    """Set the header deadline (seconds) of every :class:`HeaderTimeoutH11Protocol` connection."""
    HeaderTimeoutH11Protocol.header_timeout = seconds
