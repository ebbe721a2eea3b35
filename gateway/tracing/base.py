"""What the request path asks of tracing: a trace begun per exchange, a header for the engine, an end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..core.exchange import Exchange
    from ..core.runtime import LaneRuntime


class Trace(Protocol):
    """One request's spans while it is in flight (held on the exchange)."""

    def upstream_started(self, ex: "Exchange", lane: "LaneRuntime") -> str:
        """Start the span of the call to the engine; the W3C `traceparent` value that continues it."""
        ...

    def finish(self, ex: "Exchange", lane: "LaneRuntime | None") -> None:
        """End every span with the exchange's own timings and findings (after the analysis)."""
        ...


class Tracing(Protocol):
    enabled: bool

    def begin(self, ex: "Exchange") -> None:
        """Start the request's server span (continuing the client's `traceparent`) into `ex.trace`."""
        ...

    def exchange_done(self, ex: "Exchange", lane: "LaneRuntime | None") -> None:
        """An aftermath sink: the analysis has run, the spans can be ended."""
        ...

    def shutdown(self) -> None:
        """Export what is buffered and stop."""
        ...


class NoTracing:
    """Tracing off: the request path does nothing for it."""

    enabled = False

    def begin(self, ex: "Exchange") -> None:
        return None

    def exchange_done(self, ex: "Exchange", lane: "LaneRuntime | None") -> None:
        return None

    def shutdown(self) -> None:
        return None


NO_TRACING: Tracing = NoTracing()
