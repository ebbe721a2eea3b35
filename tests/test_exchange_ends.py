"""Every exchange ends: an exception injected at each step of the pipeline, or a
client that leaves as the answer starts, still brings the in-flight counters back to zero and
releases the upstream connection. In process (the pipeline called through ASGI), against the real
emulator over loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.pipeline.flow import Pipeline
from gateway.server.security import Caller
from gateway.server.wire import link_of
from tests.support.emulator_proc import run_emulator
from tests.support.inprocess import make_app
from tests.support.poll import until
from tests.support.routes import lane, routes

pytestmark = pytest.mark.asyncio


class Boom(Exception):
    pass


class Raising:
    """A hot-path step that fails."""

    name = "raising"
    per_lane = True

    async def apply(self, ex, lane, body) -> None:
        raise Boom("injected")


async def raising_gate(ex, lane) -> None:
    raise Boom("injected")


@pytest.fixture(scope="module")
def emulator():
    with run_emulator(flavour="vllm", decode_tps=2000) as emu:
        yield emu


@pytest.fixture
async def gateway(emulator, tmp_path: Path):
    cfg = routes({"ds": lane(emulator.url, render={"template": "deepseek_v4.1"}, limits={"max_images": 4})})
    app = make_app(cfg, tmp_path, analysis="thread")
    gw = app.gateway
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def asgi(pipeline: Pipeline):
    from starlette.requests import Request

    from gateway.server.asgi_answer import AsgiAnswer

    async def app(scope, receive, send) -> None:
        await AsgiAnswer(await pipeline.chat(Request(scope, receive), Caller()))(scope, receive, send)

    return app


def body(stream: bool) -> dict[str, Any]:
    return {"model": "ds", "stream": stream, "max_tokens": 16,
            "messages": [{"role": "user", "content": "count to ten"}]}


async def settled(gw) -> None:
    """Poll until every counter is back at zero and no upstream connection is held (or fail, naming it)."""
    lane = gw.runtime.snapshot.lanes["ds"]

    def state() -> tuple:
        return lane.inflight, [r.inflight for r in lane.upstream.replicas], lane.upstream.connections_held()

    await until(lambda: state() == (0, [0], 0), what="(lane in flight, replica in flight, connections held) at zero",
                interval=0.01, detail=lambda: f"still {state()}")


def pipelines(gw) -> dict[str, Pipeline]:
    """The gateway's own pipeline with one step made to fail, for every step."""
    base = gw.pipeline
    out = {"gate": Pipeline(gw.runtime, link_of=link_of, gates=[raising_gate], policies=base.policies)}
    for i in range(len(base.policies) + 1):
        steps = list(base.policies)
        steps.insert(i, Raising())
        after = base.policies[i - 1].name if i else "start"
        out[f"policy after {after}"] = Pipeline(gw.runtime, link_of=link_of, gates=base.gates, policies=steps)
    return out


@pytest.mark.parametrize("stream", [False, True])
async def test_an_exception_at_each_step_ends_the_exchange(gateway, stream) -> None:
    for where, pipe in pipelines(gateway).items():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(pipe)), base_url="http://gw") as c:
            r = await c.post("/v1/chat/completions", json=body(stream))
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error", where
        await settled(gateway)


@pytest.mark.parametrize("stream", [False, True])
async def test_failures_inside_forwarding_end_the_exchange(gateway, stream, monkeypatch) -> None:
    lane = gateway.runtime.snapshot.lanes["ds"]
    app = asgi(gateway.pipeline)
    injections = {
        "building the upstream body": (Pipeline, "_upstream_body"),
        "choosing the replica": (type(lane.router), "order"),
    }
    for where, (owner, attr) in injections.items():
        with monkeypatch.context() as m:
            def fail(*a, **k):
                raise Boom("injected")

            m.setattr(owner, attr, fail)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
                r = await c.post("/v1/chat/completions", json=body(stream))
            assert r.status_code == 500, where
        await settled(gateway)


async def test_an_unsafe_header_value_is_dropped_not_fatal(gateway, monkeypatch) -> None:
    from gateway.limits.policy import LimitsPolicy

    original = LimitsPolicy.apply

    async def inject(self, ex, lane, data) -> None:
        await original(self, ex, lane, data)
        ex.response_headers["X-Gateway-Test"] = "a\r\nSet-Cookie: x=1"
        ex.response_headers["X-Gateway-Test-2"] = "caf\u00e9 \u2603"

    monkeypatch.setattr(LimitsPolicy, "apply", inject)
    for stream in (False, True):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(gateway.pipeline)),
                                     base_url="http://gw") as c:
            r = await c.post("/v1/chat/completions", json=body(stream))
        assert r.status_code == 200
        assert "x-gateway-test" not in r.headers and "x-gateway-test-2" not in r.headers
        assert "set-cookie" not in r.headers
        await settled(gateway)


@pytest.mark.parametrize("fail_on", ["http.response.start", "http.response.body"])
async def test_a_client_that_leaves_as_the_answer_starts(gateway, fail_on) -> None:
    """The ASGI server's send raises (the client is gone) at the start or at the first chunk."""
    from starlette.requests import ClientDisconnect, Request

    payload = httpx.Request("POST", "http://gw/", json=body(True)).read()
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.Event().wait()  # the client says nothing more
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == fail_on:
            raise OSError("client gone")

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("gw", 80), "client": ("c", 1),
        "root_path": "", "asgi": {"version": "3.0", "spec_version": "2.4"}}
    from gateway.server.asgi_answer import AsgiAnswer

    answer = await gateway.pipeline.chat(Request(scope, receive), Caller())
    with pytest.raises((OSError, ClientDisconnect)):  # Starlette says ClientDisconnect for an OSError
        await AsgiAnswer(answer)(scope, receive, send)
    await settled(gateway)
