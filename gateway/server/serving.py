"""The gateway's HTTP/1.1 server protocol: uvicorn's httptools protocol with read deadlines and
OpenAI-shaped protocol errors.

uvicorn has a keep-alive timeout but no deadline for a request's headers or body: a client that
opens a connection and sends half a request line, or a body shorter than its Content-Length, held
its connection (and, for the body, a pipeline task) until it went away by itself, so a few hundred
slow clients could hold the gateway's connections and tasks. Here:

- headers: a request's head must be complete within `header_timeout_s` of its first byte (or of
  the connection opening): else `408` and the connection closes (a connection that sent nothing
  at all is closed without a word, like an idle keep-alive);
- body: the whole body must arrive within `body_timeout_s` of the head: else `408` (when no answer
  has started) and the connection closes; the application sees a disconnect and ends the exchange.
- a request uvicorn cannot parse gets `400` in OpenAI's JSON shape instead of uvicorn's text.

Deadlines are the gateway's Settings (GATEWAY_HEADER_TIMEOUT_S, GATEWAY_BODY_TIMEOUT_S: `gateway serve`
sets them from routes.yaml's `gateway.http` for every process it starts), read from the application
the protocol serves. One timer per connection
(`loop.call_later`), re-armed only when it would fire too late.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from . import wire

# Under an application that is not the gateway's (no Settings to read): Settings' own defaults.
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0


def error_response(status: int, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI-shaped error, closing the connection."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": code}})
    return b"".join([
        STATUS_LINE[status],
        b"content-type: application/json\r\n",
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
        b"connection: close\r\n\r\n",
        body,
    ])


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus header and body deadlines (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        served = wire.served_app(self.app)  # the gateway's application, with its Settings
        settings = served.settings if served is not None else None
        self.header_timeout_s = settings.header_timeout_s if settings is not None else HEADER_TIMEOUT_S
        self.body_timeout_s = settings.body_timeout_s if settings is not None else BODY_TIMEOUT_S
        # One timer per connection, checked when it fires: a phase sets when it is due (`_due`) and
        # what happens then (`_late`); the timer is re-armed only when it would fire too late, so a
        # request on a kept-alive connection arms none (a call_later and a cancel for each of a
        # request's two phases are a cost on every request). When it fires early, it re-arms for what is left.
        self._deadline: asyncio.TimerHandle | None = None
        self._due: float | None = None
        self._late: Any = None
        self._in_request = False  # a byte of a request has arrived and its head is not complete
        self._refused: str | None = None  # a malformed request pipelined behind answers still being written
        self._wire_routes = served.wire_handler if served is not None and served.settings.wire else None
        self._wire_link: wire.WireLink | None = None

    # -- the proxy endpoints without ASGI (gateway/server/wire.py) ---------------------------------------

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        routes = self._wire_routes
        if routes is not None and app is self.app and cycle.scope["method"] == "POST":
            handler = routes(cycle.scope["path"])
            if handler is not None:
                link = self._wire_link = wire.WireLink()
                task = link.task = self.loop.create_task(wire.serve(cycle, handler, link))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
                return
        super()._start_asgi_task(cycle, app)

    # -- timers --------------------------------------------------------------------------------

    def _arm(self, seconds: float, fire: Any) -> None:
        due = self._due = self.loop.time() + seconds
        self._late = fire
        timer = self._deadline
        if timer is not None and timer.when() > due:  # would fire too late for this phase
            timer.cancel()
            timer = None
        if timer is None:
            self._deadline = self.loop.call_at(due, self._check)

    def _disarm(self) -> None:
        self._due = self._late = None  # the timer stays armed, to be used again or to find nothing due

    def _check(self) -> None:
        self._deadline = None
        due, late = self._due, self._late
        if due is None:
            return
        if self.loop.time() < due:
            self._deadline = self.loop.call_at(due, self._check)
            return
        self._due = self._late = None
        late()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)
        link = self._wire_link
        if link is not None and link.task is not None:
            link.lost()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_request = True
        if self._due is None:  # a later request on a kept-alive connection
            self._arm(self.header_timeout_s, self._headers_late)

    def on_headers_complete(self) -> None:
        self._in_request = False
        self._arm(self.body_timeout_s, self._body_late)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # -- what happens when one fires -------------------------------------------------------------

    def _headers_late(self) -> None:
        if self.transport.is_closing():
            return
        if not self._in_request or (self.cycle is not None and not self.cycle.response_complete):
            # Not one byte of a request (a pre-opened connection): close quietly, as a keep-alive
            # timeout does; an unsolicited 408 could be read as the answer to a request sent just
            # now. Or a pipelined request is slow while an answer is being written.
            self.transport.close()
            return
        self.transport.write(error_response(
            408, f"the request headers did not arrive within {self.header_timeout_s:g}s", "request_timeout"))
        self.transport.close()

    def _body_late(self) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            self.transport.write(error_response(
                408, f"the request body did not arrive within {self.body_timeout_s:g}s", "request_timeout"))
            cycle.response_started = cycle.response_complete = True  # nothing more may be written
        if cycle is not None:
            # The application waiting in receive() gets http.disconnect and ends the exchange.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        if self._answering():
            # Pipelined behind requests still being answered: their answers go first, then this one.
            self._refused = msg
            self.flow.pause_reading()
            return
        self._refuse(msg)

    def _answering(self) -> bool:
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def _refuse(self, msg: str) -> None:
        self.transport.write(error_response(400, f"malformed HTTP request: {msg}", "invalid_http_request"))
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refused is not None and not self._answering() and not self.transport.is_closing():
            msg, self._refused = self._refused, None
            self._refuse(msg)
