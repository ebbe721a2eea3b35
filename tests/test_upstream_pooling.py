"""The gateway's upstream connections are pooled through the proxy's own reads (a gateway process
in front of a scripted upstream on loopback): what the relay reads to its end goes back to the pool."""

from __future__ import annotations

import httpx
import orjson

from tests.support.gateway_proc import run_gateway
from tests.support.scripted_upstream import Script, scripted_upstream
from tests.support.routes import lane, routes


def test_the_gateway_reuses_one_upstream_connection_for_whole_answers_and_streams() -> None:
    """A whole answer read to its end and a stream drained after [DONE] both give their connection
    back to the pool: one connection serves all four."""
    completion = orjson.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                            "finish_reason": "stop"}]})
    whole = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(completion), completion)
    chunk = orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                          "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]})
    events = [b"data: %b\n\n" % chunk, b"data: [DONE]\n\n"]
    stream = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
              *(b"%x\r\n%b\r\n" % (len(e), e) for e in events), b"0\r\n\r\n"]
    with scripted_upstream() as up:
        cfg = routes({"s": lane(up.url, upstream_model="m", render={"template": None})}, {"m": "s"})
        with run_gateway(cfg) as gw, httpx.Client(base_url=gw.url, timeout=10) as client:
            ask = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            for script, is_stream in ((whole, False), (stream, True), (whole, False), (stream, True)):
                up.script = Script(script if isinstance(script, list) else [script], keep_open=True)
                r = client.post("/v1/chat/completions", json={**ask, "stream": is_stream})
                assert r.status_code == 200, r.text
                assert ((b"data: [DONE]" in r.content) if is_stream
                        else r.json()["choices"][0]["message"]["content"] == "hi")
            posts = [s for s in up.requests if s.method == "POST"]
            probes = len(up.requests) - len(posts)  # the gateway's GET /v1/models (aiohttp's session)
            assert len(posts) == 4 and up.connections <= 1 + probes, [(s.method, s.path) for s in up.requests]
