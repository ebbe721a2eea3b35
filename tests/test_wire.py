"""The proxy endpoints served without ASGI (gateway/server/wire.py) behave as HTTP/1.1 says, on raw sockets.

Keep-alive, pipelining, `Connection: close`, HTTP/1.0, `Expect: 100-continue`, a client that stops
reading a long stream (flow control), a client that leaves mid-upload, CORS (served by Starlette),
and the same answers with the wire path turned off (GATEWAY_WIRE=0).
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from gateway.server import wire
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.inprocess import make_app
from tests.support.routes import lane, routes


def _routes(url: str, **gateway: object) -> dict:
    return routes({"l": lane(url, render={"template": None})}, {"m": "l"}, **gateway)


@pytest.fixture(scope="module")
def emu():
    with run_emulator(flavour="vllm") as emu:
        yield emu


@pytest.fixture(scope="module")
def gw(emu):
    with run_gateway(_routes(emu.url)) as gw:
        yield gw


def _request(body: dict, *, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    data = json.dumps(body).encode()
    return (b"POST /v1/chat/completions HTTP/" + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
            + extra + b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)


def _chat(content: str, **kw: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **kw}


def _read_responses(sock: socket.socket, count: int, timeout: float = 10.0) -> list[tuple[bytes, bytes]]:
    """`count` whole HTTP responses (content-length or chunked) from the socket: (head, body)."""
    sock.settimeout(timeout)
    buf = b""
    out: list[tuple[bytes, bytes]] = []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            more = sock.recv(65536)
            if not more:
                raise AssertionError(f"connection closed after {len(out)} responses: {buf[:200]!r}")
            buf += more
        head, _, buf = buf.partition(b"\r\n\r\n")
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            body = b""
            while True:
                while b"\r\n" not in buf:
                    buf += sock.recv(65536)
                size_line, _, buf = buf.partition(b"\r\n")
                size = int(size_line, 16)
                while len(buf) < size + 2:
                    buf += sock.recv(65536)
                body, buf = body + buf[:size], buf[size + 2:]
                if size == 0:
                    break
        else:
            length = int(lower.split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(buf) < length:
                buf += sock.recv(65536)
            body, buf = buf[:length], buf[length:]
        out.append((head, body))
    return out


def _port(gw) -> int:
    return int(gw.url.rsplit(":", 1)[1])


def test_keep_alive_serves_many_requests_on_one_connection(gw) -> None:
    with socket.create_connection(("127.0.0.1", _port(gw))) as s:
        for i in range(20):
            s.sendall(_request(_chat(f"hello {i}")))
            [(head, body)] = _read_responses(s, 1)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert json.loads(body)["choices"][0]["message"]["content"]


def test_pipelined_requests_are_answered_in_order(gw) -> None:
    with socket.create_connection(("127.0.0.1", _port(gw))) as s:
        s.sendall(_request(_chat("one")) + _request({"model": "nope", "messages": []})
                  + _request(_chat("three", stream=True)))
        (h1, b1), (h2, b2), (h3, b3) = _read_responses(s, 3)
    assert h1.startswith(b"HTTP/1.1 200") and json.loads(b1)["object"] == "chat.completion"
    assert h2.startswith(b"HTTP/1.1 400") and json.loads(b2)["error"]["code"]
    assert h3.startswith(b"HTTP/1.1 200") and b3.rstrip().endswith(b"data: [DONE]")


def test_connection_close_and_http_1_0_close_after_the_answer(gw) -> None:
    for extra, version in ((b"Connection: close\r\n", b"1.1"), (b"", b"1.0")):
        with socket.create_connection(("127.0.0.1", _port(gw))) as s:
            s.sendall(_request(_chat("bye"), extra=extra, version=version))
            [(head, body)] = _read_responses(s, 1)
            assert b" 200 " in head.split(b"\r\n")[0] and b"connection: close" in head.lower()
            s.settimeout(5)
            assert s.recv(1) == b"", "the gateway closes the connection"


def test_expect_100_continue_gets_the_interim_answer(gw) -> None:
    data = json.dumps(_chat("continue?")).encode()
    with socket.create_connection(("127.0.0.1", _port(gw))) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n")
        s.settimeout(5)
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(data)
        [(head, _)] = _read_responses(s, 1)
    assert head.startswith(b"HTTP/1.1 200")


def test_a_client_that_stops_reading_a_long_stream_does_not_stall_others(emu, gw) -> None:
    body = _chat("a long answer", stream=True, max_tokens=4000)
    with socket.create_connection(("127.0.0.1", _port(gw))) as slow:
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(_request(body))
        # While that one is not read, the gateway keeps serving everyone else.
        started = time.monotonic()
        for i in range(5):
            r = httpx.post(gw.url + "/v1/chat/completions", json=_chat(f"meanwhile {i}"), timeout=10)
            assert r.status_code == 200
        assert time.monotonic() - started < 10
        # Reading it at last, the stream is whole.
        [(head, data)] = _read_responses(slow, 1, timeout=30)
    assert head.startswith(b"HTTP/1.1 200") and data.rstrip().endswith(b"data: [DONE]")


def test_a_client_that_leaves_mid_upload_is_forgotten(gw) -> None:
    with socket.create_connection(("127.0.0.1", _port(gw))) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"model\":")
    # The gateway is unharmed and answers the next request.
    r = httpx.post(gw.url + "/v1/chat/completions", json=_chat("after"), timeout=10)
    assert r.status_code == 200


@pytest.fixture(scope="module")
def small(emu):
    """A gateway with a small body limit (200 KB)."""
    with run_gateway(_routes(emu.url, max_request_bytes=200_000)) as gw:
        yield gw


def _chunked(data: bytes, piece: int) -> bytes:
    parts = [data[i:i + piece] for i in range(0, len(data), piece)]
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def _upload(port: int, data: bytes, *, chunked: bool, expect: bool = False, write: int = 4096) -> tuple[bytes, bytes]:
    """A body written in small pieces (many reads on the gateway's side), framed by length or chunks."""
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % len(data)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + (b"Expect: 100-continue\r\n" if expect else b"") + framing + b"\r\n")
        if expect:
            s.settimeout(5)
            assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")
        payload = _chunked(data, 3000) if chunked else data
        try:
            for i in range(0, len(payload), write):
                s.sendall(payload[i:i + write])
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered (413) before the whole body was sent
        [(head, body)] = _read_responses(s, 1, timeout=20)
    return head, body


def test_a_body_in_many_small_pieces_is_read_whole(small, gw) -> None:
    """A body arriving in many reads is read whole: by length, chunked, and after
    `Expect: 100-continue`."""
    data = json.dumps(_chat("y" * 150_000 + " the end")).encode()
    assert 150_000 < len(data) < 200_000
    for chunked in (False, True):
        head, body = _upload(_port(small), data, chunked=chunked)
        assert head.startswith(b"HTTP/1.1 200"), (chunked, head, body[:300])
    big = json.dumps(_chat("z" * 1_500_000)).encode()
    head, _ = _upload(_port(gw), big, chunked=False, expect=True, write=65536)
    assert head.startswith(b"HTTP/1.1 200")


def test_a_body_longer_than_a_piece_arrives_whole(gw) -> None:
    """Above wire.PIECE (8 MiB) a body reaches the pipeline in pieces (its size limit is checked per
    piece): by length and chunked, the engine gets all of it (and refuses it for its length,
    counting the whole body's tokens)."""
    from gateway.server.wire import PIECE

    words = (PIECE + 1_000_000) // 5
    data = json.dumps(_chat("word " * words + "the end")).encode()
    assert len(data) > PIECE
    refusals = []
    for chunked in (False, True):
        head, body = _upload(_port(gw), data, chunked=chunked, write=1 << 20)
        assert head.startswith(b"HTTP/1.1 400"), (chunked, head, body[:300])
        refusals.append(json.loads(body)["error"])
    assert refusals[0] == refusals[1] and refusals[0]["param"] == "input_tokens", refusals
    assert int(refusals[0]["message"].rsplit("value=", 1)[1].rstrip(")")) > words


def test_a_chunked_body_over_the_limit_is_413_and_the_gateway_goes_on(small) -> None:
    data = json.dumps(_chat("x" * 400_000)).encode()
    head, body = _upload(_port(small), data, chunked=True)
    assert head.startswith(b"HTTP/1.1 413") and json.loads(body)["error"]["code"] == "request_too_large"
    r = httpx.post(small.url + "/v1/chat/completions", json=_chat("after"), timeout=10)
    assert r.status_code == 200


def test_cors_configured_answers_carry_the_cors_headers(emu) -> None:
    cfg = _routes(emu.url, cors={"allow_origins": ["https://app.example"]})
    with run_gateway(cfg) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=_chat("hi"),
                       headers={"Origin": "https://app.example"}, timeout=10)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"


def _comparable(r: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    skip = {"date", "x-request-id", "x-gateway-conversation"}
    return r.status_code, {k: v for k, v in r.headers.items() if k not in skip}, r.content


def test_the_asgi_path_answers_alike(emu, gw) -> None:
    """GATEWAY_WIRE=0 serves the same routes through Starlette: same status, headers and bodies."""
    cases = [_chat("same", seed=1), {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
             {"model": "m"}, _chat("same stream", stream=True, seed=1)]
    with run_gateway(_routes(emu.url), env={"GATEWAY_WIRE": "0"}) as asgi:
        for case in cases:
            a = httpx.post(gw.url + "/v1/chat/completions", json=case, timeout=10)
            b = httpx.post(asgi.url + "/v1/chat/completions", json=case, timeout=10)
            sa, ha, ba = _comparable(a)
            sb, hb, bb = _comparable(b)
            assert (sa, ha) == (sb, hb), case
            assert _payloads(ba) == _payloads(bb), case


def _payloads(body: bytes) -> list[object]:
    """The JSON payloads of a body or of a stream's events, without the per-answer id and time."""
    if not body.startswith(b"data:"):
        docs = [json.loads(body)]
    else:
        docs = [json.loads(e[5:]) if e[5:].strip() != b"[DONE]" else "[DONE]"
                for e in body.split(b"\n\n") if e.strip()]
    for doc in docs:
        if isinstance(doc, dict):
            doc.pop("created", None)
            doc.pop("id", None)
    return docs


def test_the_gateways_application_is_found_below_any_middleware(tmp_path) -> None:
    """The server reads its deadlines from the application it wraps, through uvicorn's middleware."""
    app = make_app(routes({"a": lane("http://127.0.0.1:9")}, {"m": "a"}), tmp_path)

    class Middleware:
        def __init__(self, inner: object) -> None:
            self.app = inner

    found = wire.served_app(Middleware(Middleware(app)))
    assert found is not None and found.settings.header_timeout_s > 0
    assert wire.served_app(Middleware(object())) is None
