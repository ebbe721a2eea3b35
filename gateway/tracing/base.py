"""What the request path asks of tracing: a trace begun per exchange, a header for the engine, an end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..core.exchange import Trace

if TYPE_CHECKING:
    from ..core.exchange import Exchange
    from ..core.runtime import LaneRuntime

__all__ = ["Trace", "Tracing", "NoTracing", "NO_TRACING"]


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
