"""Every relay path hands the client the engine's bytes, whatever an event's size and wherever the reads cut.

The only changes allowed are the documented rewrites; here that is the public model name at the head of an
event (the lane `renamed` serves public `pub` from engine model `m`; the lane `same` serves `m` as `m`, so
its bytes must come back untouched). Events run from an empty text to 1 MB, their content holds the
bytes that a careless byte-level rewrite would take for a head (`=`, `"model":"m"` escaped, a copy of
another event's first bytes), and the upstream writes the stream in pieces cut at drawn places.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, routes
from tests.support.scripted_upstream import Script, scripted_upstream

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses"}
# Content a head-rewrite must never touch: the old bug put a learnt head where `=` stood.
FILLER = 'x = y; "model":"m", event: response.created\\data: {} é 😀 = '


@pytest.fixture(scope="module")
def up():
    with scripted_upstream() as u:
        yield u


@pytest.fixture(scope="module")
def gw(up):
    lanes = {"same": lane(up.url, upstream_model="m"), "renamed": lane(up.url, upstream_model="m")}
    with run_gateway(routes(lanes, {"m": "same", "pub": "renamed"})) as g:
        yield g


def _text(size: int) -> str:
    return (FILLER * (size // len(FILLER) + 1))[:size]


def _compact(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def chat_events(sizes: list[int]) -> list[bytes]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [b"data: " + _compact({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                       "finish_reason": None}]}) + b"\n\n"]
    for size in sizes:
        out.append(b"data: " + _compact({**head, "choices": [{"index": 0, "delta": {"content": _text(size)},
                                                              "finish_reason": None}]}) + b"\n\n")
    out.append(b"data: " + _compact({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
               + b"\n\n")
    out.append(b"data: " + _compact({**head, "choices": [], "usage": {
        "prompt_tokens": 5, "completion_tokens": len(sizes), "total_tokens": 5 + len(sizes)}}) + b"\n\n")
    return out + [b"data: [DONE]\n\n"]


def completion_events(sizes: list[int]) -> list[bytes]:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    out = [b"data: " + _compact({**head, "choices": [{"index": 0, "text": _text(size), "logprobs": None,
                                                      "finish_reason": None}]}) + b"\n\n" for size in sizes]
    out.append(b"data: " + _compact({**head, "choices": [{"index": 0, "text": "", "logprobs": None,
                                                          "finish_reason": "stop"}]}) + b"\n\n")
    out.append(b"data: " + _compact({**head, "choices": [], "usage": {
        "prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}) + b"\n\n")
    return out + [b"data: [DONE]\n\n"]


def response_events(sizes: list[int]) -> list[bytes]:
    """A Responses stream as vLLM sends it: the whole response object (tools included) in the first
    and last events, which makes them as large as the client's tools (Codex: ~18 KB)."""
    tools = [{"type": "function", "name": f"t{i}", "description": _text(size),
              "parameters": {"type": "object", "properties": {"model": {"type": "string"}}}}
             for i, size in enumerate(sizes)]
    resp = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "status": "in_progress",
            "tools": tools, "output": [], "reasoning": {"effort": "medium"}}

    def ev(kind: str, obj: dict) -> bytes:
        return f"event: {kind}\ndata: ".encode() + _compact({"type": kind, **obj}) + b"\n\n"

    out = [ev("response.created", {"response": resp}), ev("response.in_progress", {"response": resp})]
    out += [ev("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0,
                                              "delta": _text(size)}) for size in sizes]
    done = {**resp, "status": "completed", "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}}
    return out + [ev("response.completed", {"response": done})]


BUILD = {"chat": chat_events, "completions": completion_events, "responses": response_events}


def _request(kind: str, model: str) -> dict:
    if kind == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "stream_options": {"include_usage": True}}
    if kind == "completions":
        return {"model": model, "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    return {"model": model, "input": "hi", "stream": True}


def _expected(events: list[bytes], model: str) -> bytes:
    if model == "m":
        return b"".join(events)
    return b"".join(e.replace(b'"model":"m"', b'"model":"pub"', 1) for e in events)


def _pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return [head] + [b"%x\r\n" % (b - a) + stream[a:b] + b"\r\n" for a, b in zip(at, at[1:]) if b > a] \
        + [b"0\r\n\r\n"]


SIZES = st.lists(st.one_of(st.integers(0, 300), st.integers(300, 70_000), st.integers(70_000, 1_000_000)),
                 min_size=1, max_size=4).filter(lambda s: sum(s) <= 1_500_000)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(sorted(BUILD)), model=st.sampled_from(["m", "pub"]), sizes=SIZES,
       cuts=st.lists(st.integers(0, 1 << 22), max_size=12))
def test_every_event_size_relays_exactly(gw, up, kind: str, model: str, sizes: list[int], cuts: list[int]) -> None:
    events = BUILD[kind](sizes)
    up.script = Script(_pieces(b"".join(events), cuts), pause_s=0.0002)
    r = httpx.post(gw.base_url + PATHS[kind].removeprefix("/v1"), json=_request(kind, model), timeout=60)
    assert r.status_code == 200
    assert r.content == _expected(events, model)


def test_responses_events_of_codex_size(gw, up) -> None:
    """Codex's ~40 tools make its first and last Responses events ~18 KB; every byte comes back."""
    events = response_events([400] * 40)
    up.script = Script(_pieces(b"".join(events), [5_600, 16_384, 16_385, 40_000]))
    for model in ("m", "pub"):
        r = httpx.post(gw.base_url + "/responses", json=_request("responses", model), timeout=60)
        assert r.content == _expected(events, model)
        for event in r.content.split(b"\n\n")[:-1]:
            json.loads(event.split(b"data: ", 1)[1])


def test_whole_responses_body_keeps_tool_schemas(gw, up) -> None:
    """A whole Responses body renames the model and leaves a tool parameter named `model` alone."""
    body = _compact({"id": "resp_1", "object": "response", "model": "m", "status": "completed", "output": [],
                     "tools": [{"type": "function", "name": "spawn", "parameters": {
                         "type": "object", "properties": {"model": {"type": "string"}}}}],
                     "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}})
    up.script = Script([b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                           % len(body) + body])
    r = httpx.post(gw.base_url + "/responses", json={"model": "pub", "input": "hi"}, timeout=30)
    assert r.status_code == 200
    out = r.json()
    assert out["model"] == "pub"
    assert out["tools"][0]["parameters"]["properties"]["model"] == {"type": "string"}
