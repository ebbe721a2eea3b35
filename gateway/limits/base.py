"""The one interface every lane limit implements, and the per-request context they share.

A limit is a small object with a `name` (its key in routes.yaml, also what `ex.fire_limit` records),
the facts it needs from the single scan of the request (`needs`), `active(limits)` (is it configured on
this lane?) and `enforce(ctx)`, which either returns (the request passes, possibly rewritten) or raises
through `ctx.reject(...)`. Limits never copy the body unless they rewrite it, and then only the messages
they change (copy-on-write), so an untouched 2 MB history costs nothing beyond the scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Protocol

from ..core.errors import GatewayError

if TYPE_CHECKING:
    from ..core.config import Lane, Limits
    from ..core.exchange import Exchange
    from ..render.renderer import Renderer
    from .scan import Facts

# Response header listing what the gateway did to a request that it still forwarded.
LIMITS_HEADER = "X-Gateway-Limits"

# Fact groups a limit may ask the scan for.
NEED_IMAGES = "images"
NEED_TEXT = "text"  # byte counts and the list of text spans (token bounds and estimates)
NEED_PLACEHOLDERS = "placeholders"


class LimitedLane(Protocol):
    """What the limits read of a lane (core.runtime.LaneRuntime is one)."""

    config: "Lane"
    renderer: "Renderer | None"


@dataclass(slots=True)
class Context:
    """One request as the limits see it."""

    ex: "Exchange"
    lane: LimitedLane
    limits: "Limits"
    body: dict[str, Any]
    facts: "Facts | None" = None
    notes: list[str] = field(default_factory=list)  # entries of the X-Gateway-Limits header

    @property
    def is_chat(self) -> bool:
        return "messages" in self.body

    def reject(self, name: str, message: str, *, param: str | None, code: str, status: int = 400) -> NoReturn:
        """Refuse the request in OpenAI's shape and record which limit did it."""
        self.ex.fire_limit(name)
        self.ex.limits.rejected = name
        raise GatewayError(status, message, param=param, code=code, type="invalid_request_error")

    def rewrote(self, name: str, note: str) -> None:
        """The request was changed to fit the limit and will be forwarded: record and announce it."""
        self.ex.fire_limit(name)
        self.notes.append(f"{name} {note}")


class Limit:
    """Base class of one lane limit. Subclasses set `name` and `needs` and implement the two methods."""

    name: ClassVar[str]
    needs: ClassVar[frozenset[str]] = frozenset()

    def active(self, limits: "Limits") -> bool:
        raise NotImplementedError

    def needs_for(self, ctx: Context) -> frozenset[str]:
        """The facts this request needs scanned; a limit that can decide without them returns fewer."""
        return self.needs

    async def enforce(self, ctx: Context) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<limit {self.name}>"


def where(i: int, field_name: str, j: int | None = None) -> str:
    """The OpenAI-style location of a value: messages[3].content[1], messages[2].reasoning_content."""
    if i < 0:
        return field_name
    base = f"messages[{i}].{field_name}"
    return base if j is None else f"{base}[{j}]"
