"""A request body held as the buffers it is made of, so a large one is never joined on the event loop.

A first-seen 2 MB body whose fields the gateway rewrote (a vLLM lane asks for `return_token_ids`)
is the rewritten fields plus the client's own bytes of its messages. Joining them into one bytes
object would copy the whole body into a fresh buffer on the event loop, for every request
(bench/steps.py "serialise", fresh pages counted). Held as parts, each reader takes them as they
are: the upstream client writes them with one `writelines` (writev), the analysis hand-off copies
them into its shared memory (conversations/handoff.py). `bytes(parts)` joins them for the rare
reader that wants one buffer.
"""

from __future__ import annotations

from typing import Union, final


@final
class Parts:
    """The body as consecutive buffers (bytes or memoryviews of bytes); immutable."""

    __slots__ = ("buffers", "size")

    def __init__(self, buffers: tuple[bytes | memoryview, ...]) -> None:
        self.buffers = buffers
        self.size = sum(len(b) for b in buffers)

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.buffers)

    def __repr__(self) -> str:
        return f"Parts({len(self.buffers)} buffers, {self.size} bytes)"


Body = Union[bytes, Parts]


def whole(body: Body) -> bytes:
    """One bytes object (a copy only when the body is in parts)."""
    return body if type(body) is bytes else bytes(body)
