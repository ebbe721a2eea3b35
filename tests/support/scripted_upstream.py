"""A hostile upstream on loopback: answers every request with exactly the bytes a test scripts.

Raw asyncio sockets in a background thread (no HTTP library on this side, so a script may be
anything: a bad status line, a body shorter than its Content-Length, gzip labelled as br, a stream
cut mid-event). Started once per test module; each test (or hypothesis example) sets the script.

    with scripted_upstream() as up:
        up.script = Script([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"])
        ... the gateway's lane points at up.url ...
        up.requests[-1].headers["accept-encoding"]
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Iterator


@dataclass(frozen=True)
class Script:
    """What the upstream writes: the pieces in order (a short pause between two pieces, so the
    gateway reads them separately), then it closes the connection unless `keep_open`."""

    pieces: tuple[bytes, ...] | list[bytes]
    pause_s: float = 0.0005
    keep_open: bool = False
    stall_s: float = 0.0  # wait this long after the last piece before closing


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ScriptedUpstream:
    port: int
    script: Script = field(default_factory=lambda: Script([b"HTTP/1.1 503 Service Unavailable\r\n"
                                                           b"Content-Length: 0\r\nConnection: close\r\n\r\n"]))
    requests: list[Seen] = field(default_factory=list)
    connections: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _serve_one(up: ScriptedUpstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    up.connections += 1
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path = (lines[0].split(" ") + ["", ""])[:2]
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length") or 0)
            body = await reader.readexactly(length) if length else b""
            up.requests.append(Seen(method, path, headers, body))
            del up.requests[:-50]
            script = up.script
            for i, piece in enumerate(script.pieces):
                if i and script.pause_s:
                    await asyncio.sleep(script.pause_s)  # the script: pieces the gateway reads apart
                writer.write(piece)
                await writer.drain()
            if script.stall_s:
                await asyncio.sleep(script.stall_s)  # the script: a stall before the close
            if not script.keep_open:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.contextmanager
def scripted_upstream() -> Iterator[ScriptedUpstream]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict = {}

    async def start() -> None:
        up = ScriptedUpstream(0)
        server = await asyncio.start_server(lambda r, w: _serve_one(up, r, w), "127.0.0.1", 0,
                                            limit=1 << 20)
        up.port = server.sockets[0].getsockname()[1]
        holder["up"], holder["server"] = up, server
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, name="scripted-upstream", daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield holder["up"]
    finally:
        async def stop() -> None:
            holder["server"].close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def http_response(status: int, body: bytes, headers: list[tuple[str, str]] | None = None,
                  framing: str = "length", reason: str = "X") -> bytes:
    """A response as bytes. framing: length | close | chunked | short (Content-Length promises more)
    | chunked_cut (no terminating chunk)."""
    head = [f"HTTP/1.1 {status} {reason}"]
    for k, v in headers or []:
        head.append(f"{k}: {v}")
    if framing in ("length", "short"):
        head.append(f"Content-Length: {len(body) + (17 if framing == 'short' else 0)}")
    elif framing in ("chunked", "chunked_cut"):
        head.append("Transfer-Encoding: chunked")
    head.append("Connection: close")
    out = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    if framing in ("chunked", "chunked_cut"):
        step = max(1, len(body) // 3 or 1)
        for i in range(0, len(body), step):
            part = body[i:i + step]
            out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
        if framing == "chunked":
            out += b"0\r\n\r\n"
    else:
        out += body
    return out
