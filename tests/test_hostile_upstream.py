"""Hostile upstreams: whatever a replica sends, the client gets the upstream's
answer as a valid response or an OpenAI-shaped error (in a stream: an error event, then [DONE]);
never a dropped connection or a 500, never the lane's key; and the gateway keeps serving.

One gateway process (uvicorn, real sockets) and one scripted upstream (raw asyncio sockets in this
process, tests/support/scripted_upstream.py) for the whole module; each hypothesis example sets the
upstream's script and sends one request through the gateway.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib

import brotli
import httpx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from gateway.relay.wellformed import chunk_problem, completion_problem
from tests.support.gateway_proc import run_gateway
from tests.support.scripted_upstream import Script, http_response, scripted_upstream
from tests.support.routes import lane, routes
from tests.support.poll import wait_until

SECRET = "lane-upstream-key-7f3a9c21b5d04e68aa1"
ADMIN = "hostile-tests-admin-key-0123456789"
EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "2000"))


@pytest.fixture(scope="module")
def upstream():
    with scripted_upstream() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(upstream):
    hostile = lane(upstream.url, upstream_model="m", api_key_env="HOSTILE_UPSTREAM_KEY", render={"template": None},
                   # Generous first byte, short idle; a breaker that never opens (every example must reach it).
                   timeouts={"connect": 1, "first_byte": 5, "idle": 2},
                   breaker={"failures": 1000000000, "cool_down_s": 0.01})
    # The same upstream as an SGLang lane: Anthropic Messages go to it translated to chat completions.
    cfg = routes({"hostile": hostile, "hostile-sg": {**hostile, "engine": "sglang"}},
                 {"m": "hostile", "m-sg": "hostile-sg"}, admin_key_env="HOSTILE_ADMIN_KEY")
    env = {"HOSTILE_ADMIN_KEY": ADMIN, "HOSTILE_UPSTREAM_KEY": SECRET}
    with run_gateway(cfg, env=env) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway):
    with httpx.Client(base_url=gateway.url, timeout=20) as c:
        yield c


# -- what a well-formed answer looks like, and how it can be broken --------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=40)


def completion(content: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def chunks(parts: list[str]) -> list[dict]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    out += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in parts]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    out.append({**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
    return out


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["choices", "delta", "content", "message", "usage", "error", "x", "tool_calls"]),
        inner, max_size=3),
    max_leaves=8,
)

WRONG_SHAPES = st.one_of(
    JSON,
    st.sampled_from([
        {"choices": [1]}, {"choices": "x"}, {"choices": [{"delta": "x"}]},
        {"choices": [{"delta": {"content": 5}}]}, {"choices": [{"delta": {"tool_calls": [1]}}]},
        {"choices": [{"message": {"content": ["a"]}}]}, {"choices": [{"finish_reason": 3}]},
        {"choices": [], "usage": {"prompt_tokens": "many"}}, {"choices": [{"delta": {"tool_calls": [
            {"function": {"arguments": {}}}]}}]}, [], "x", 3, None,
    ]),
)

SECRET_TEXTS = st.sampled_from([
    f"invalid api key {SECRET}", f"Authorization: Bearer {SECRET}", f"got token={SECRET}&x=1",
    "bad key sk-proj-abcdefghijklmnop0123", f"<html><body>401 {SECRET[:14]}... refused</body></html>",
    f"{SECRET}", "Bearer abc.def.ghi rejected",
])


def error_body(draw) -> bytes:
    message = draw(SECRET_TEXTS | TEXT)
    shape = draw(st.sampled_from(["openai", "flat", "detail", "text", "str_error", "weird"]))
    if shape == "openai":
        return json.dumps({"error": {"message": message, "type": draw(st.sampled_from(["BadRequestError", SECRET])),
                                     "param": draw(st.none() | st.just(SECRET)),
                                     "code": draw(st.sampled_from([400, "bad", SECRET, None]))}}).encode()
    if shape == "flat":
        return json.dumps({"object": "error", "message": message, "code": 400}).encode()
    if shape == "detail":
        return json.dumps({"detail": message}).encode()
    if shape == "str_error":
        return json.dumps({"error": message}).encode()
    if shape == "weird":
        return json.dumps(draw(JSON)).encode()
    return message.encode("utf-8", "surrogatepass")


def sse(events: list[bytes], eol: bytes, prefix: bytes) -> bytes:
    out = b""
    for e in events:
        out += prefix + e + eol + eol
    return out


@st.composite
def behaviours(draw):
    """(stream requested, the upstream's script, the content a valid answer carries or None)."""
    stream = draw(st.booleans())
    kind = draw(st.sampled_from(["valid", "valid", "valid", "other_mode", "wrong_shape", "error", "garbage"]))
    status = draw(st.sampled_from([200, 200, 200, 500, 401, 429, 503]) | st.integers(100, 599))
    parts = draw(st.lists(TEXT, max_size=4))
    content = "".join(parts)
    eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    prefix = draw(st.sampled_from([b"data: ", b"data:"]))
    expect: str | None = None
    if kind in ("valid", "other_mode"):
        as_stream = stream if kind == "valid" else not stream
        if as_stream:
            events = [json.dumps(c).encode() for c in chunks(parts)] + [b"[DONE]"]
            if draw(st.booleans()):
                events.insert(1, b"")  # becomes an empty data field: dropped as a blank event
            body = sse(events, eol, prefix)
            if draw(st.integers(0, 9)) == 0:
                body = b": keep-alive" + eol + eol + body
            ctype = "text/event-stream"
        else:
            body = json.dumps(completion(content)).encode()
            ctype = "application/json"
        expect = content if kind == "valid" else None
    elif kind == "wrong_shape":
        bad = json.dumps(draw(WRONG_SHAPES)).encode()
        if stream and draw(st.booleans()):
            good = [json.dumps(c).encode() for c in chunks(parts)]
            at = draw(st.integers(0, len(good)))
            body = sse(good[:at] + [bad] + good[at:] + [b"[DONE]"], eol, prefix)
            ctype = "text/event-stream"
        else:
            body, ctype = bad, "application/json"
    elif kind == "error":
        body = error_body(draw)
        ctype = "application/json"
        if stream and status == 200 and draw(st.booleans()):
            body = sse([b'{"error": {"message": "' + SECRET.encode() + b' expired"}}', b"[DONE]"], eol, prefix)
            ctype = "text/event-stream"
    else:
        body = draw(st.binary(max_size=300))
        ctype = draw(st.sampled_from(["application/json", "text/event-stream", "text/html"]))
    # Cut anywhere: the upstream closes cleanly after this many bytes of its body.
    if draw(st.integers(0, 4)) == 0 and body:
        body = body[:draw(st.integers(0, len(body) - 1))]
        expect = None
    ctype = draw(st.sampled_from([ctype, ctype, ctype, "text/plain", None]))
    coding = draw(st.sampled_from([None, None, "identity", "gzip", "deflate", "raw-deflate", "br",
                                   "gzip-mislabelled", "zstd", "gzip-truncated"]))
    headers = [("Content-Type", ctype)] if ctype else []
    if coding in (None, "identity"):
        wire = body
        if coding:
            headers.append(("Content-Encoding", coding))
    elif coding == "gzip":
        wire, _ = gzip.compress(body), headers.append(("Content-Encoding", "gzip"))
    elif coding == "deflate":
        wire, _ = zlib.compress(body), headers.append(("Content-Encoding", "deflate"))
    elif coding == "raw-deflate":
        c = zlib.compressobj(wbits=-15)
        wire, _ = c.compress(body) + c.flush(), headers.append(("Content-Encoding", "deflate"))
    elif coding == "br":
        wire, _ = brotli.compress(body), headers.append(("Content-Encoding", "br"))
    elif coding == "gzip-mislabelled":
        wire, _ = body, headers.append(("Content-Encoding", "gzip"))
        expect = None
    elif coding == "gzip-truncated":
        full = gzip.compress(body)
        wire, _ = full[:max(1, len(full) - 5)], headers.append(("Content-Encoding", "gzip"))
        expect = None
    else:
        wire, _ = body, headers.append(("Content-Encoding", coding))
        expect = None
    framing = draw(st.sampled_from(["length", "length", "close", "chunked", "short", "chunked_cut"]))
    if framing in ("short", "chunked_cut"):
        expect = None
    if status != 200:
        expect = None
    raw = http_response(status, wire, headers, framing)
    if draw(st.integers(0, 19)) == 0:  # not HTTP at all, or a broken head
        raw = draw(st.sampled_from([b"", b"garbage\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n{}",
                                    b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nAuthorization: " + SECRET.encode() + b"\r\n"]))
        expect = None
    cuts = sorted(draw(st.lists(st.integers(0, max(0, len(raw) - 1)), max_size=3)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)]) if raw[a:b]]
    return stream, Script(pieces or [b""]), expect


# -- what the client must get -----------------------------------------------------------------------

def check_answer(resp: httpx.Response, stream: bool, expect: str | None) -> None:
    text = resp.text
    assert SECRET not in text and SECRET[:12] not in text, text[:300]
    assert resp.status_code != 500, text[:300]
    if resp.status_code != 200:
        assert resp.headers["content-type"].startswith("application/json"), resp.headers
        err = resp.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str)
        assert err["code"] is None or isinstance(err["code"], str)
        assert expect is None, f"a valid answer became HTTP {resp.status_code}: {text[:300]}"
        return
    if not stream:
        assert resp.headers["content-type"].startswith("application/json")
        body = resp.json()
        assert completion_problem(body) is None, text[:300]
        if expect is not None:
            assert body["choices"][0]["message"]["content"] == expect
        return
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert text.endswith("\n\n"), text[-200:]
    events = [e for e in text.split("\n\n") if e]
    assert events[-1].replace(" ", "") == "data:[DONE]", events[-3:]
    got = []
    for i, event in enumerate(events[:-1]):
        if event.startswith(":"):
            continue
        assert event.startswith("data:") and "\n" not in event, event[:200]  # one data line
        payload = json.loads(event[5:])
        if "error" in payload:
            assert i == len(events) - 2, f"an error event must be the last before [DONE]: {events[-3:]}"
            assert isinstance(payload["error"]["message"], str)
            assert expect is None, f"a valid stream ended in an error: {payload}"
            continue
        assert chunk_problem(payload) is None, payload
        for choice in payload["choices"]:
            got.append((choice.get("delta") or {}).get("content") or "")
    if expect is not None:
        assert "".join(got) == expect


REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


# `make test` runs a fixed draw of 2,000 (CI never depends on luck); HOSTILE_EXAMPLES=N draws N new ones.
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="HOSTILE_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(behaviours())
def test_any_upstream_behaviour_gives_a_valid_answer_or_an_openai_error(upstream, client, case):
    stream, script, expect = case
    note(f"stream={stream} expect={expect!r} script={script.pieces!r}")
    upstream.script = script
    try:
        resp = client.post("/v1/chat/completions", json={**REQUEST, "stream": stream})
    except httpx.TransportError as exc:
        pytest.fail(f"the gateway dropped the connection ({exc!r}) for {script.pieces!r}")
    check_answer(resp, stream, expect)


# -- the same contract on the Responses API and the JSON passthrough paths ---------------------------

def response_events(parts: list[str]) -> list[dict]:
    resp = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    out = [{"type": "response.created", "response": resp}]
    out += [{"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
             "delta": p} for p in parts]
    done = {**resp, "status": "completed", "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "".join(parts), "annotations": []}]}]}
    out.append({"type": "response.completed", "response": done})
    return [{**e, "sequence_number": i} for i, e in enumerate(out)]


def typed_stream_script(draw, events: list[dict | bytes], expect: str | None) -> tuple[Script, str | None]:
    """A typed event stream (Responses, Messages) as the upstream sends it: maybe cut short (then nothing
    is expected), framed one of three ways, its bytes delivered in up to four reads."""
    body = named_sse(events, draw(st.sampled_from([b"\n", b"\r\n"])))
    if draw(st.integers(0, 4)) == 0:
        body = body[:draw(st.integers(0, len(body) - 1))]
        expect = None
    raw = http_response(200, body, [("Content-Type", "text/event-stream")],
                        draw(st.sampled_from(["length", "close", "chunked"])))
    cuts = sorted(draw(st.lists(st.integers(0, len(raw) - 1), max_size=3)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)]) if raw[a:b]]
    return Script(pieces), expect


def named_sse(events: list[dict | bytes], eol: bytes) -> bytes:
    out = b""
    for e in events:
        if isinstance(e, dict):
            out += b"event: " + e["type"].encode() + eol + b"data: " + json.dumps(e).encode() + eol + eol
        else:
            out += b"data: " + e + eol + eol
    return out


@st.composite
def responses_behaviours(draw):
    """A Responses stream: valid, with a wrong event spliced in, with an error event, or cut."""
    parts = draw(st.lists(TEXT, max_size=4))
    events: list[dict | bytes] = list(response_events(parts))
    kind = draw(st.sampled_from(["valid", "valid", "wrong", "error", "failed", "garbage"]))
    expect: str | None = "".join(parts) if kind == "valid" else None
    at = draw(st.integers(1, len(events) - 1))
    if kind == "wrong":
        events.insert(at, json.dumps(draw(WRONG_SHAPES | st.just({"no": "type"}))).encode())
    elif kind == "error":
        message = draw(SECRET_TEXTS)
        events.insert(at, {"type": "error", "code": draw(st.sampled_from(["server_error", SECRET, None])),
                           "message": message, "param": None, "sequence_number": at})
    elif kind == "failed":
        events[-1] = {"type": "response.failed", "sequence_number": len(events) - 1,
                      "response": {"id": "resp_1", "status": "failed", "output": [],
                                   "error": {"code": "server_error", "message": draw(SECRET_TEXTS)}}}
    elif kind == "garbage":
        events.insert(at, draw(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b)))
    return typed_stream_script(draw, events, expect)


def check_responses_stream(resp: httpx.Response, expect: str | None) -> None:
    text = resp.text
    assert SECRET not in text and SECRET[:12] not in text, text[:300]
    assert resp.status_code != 500, text[:300]
    if resp.status_code != 200:
        assert expect is None and resp.json()["error"]["message"]
        return
    events = [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]
    got, errors = [], 0
    for i, event in enumerate(events):
        data = [line[5:].strip() for line in event.split("\n") if line.startswith("data:")]
        if not data or data == ["[DONE]"]:
            continue
        obj = json.loads(data[0])  # every event the client gets is JSON
        assert isinstance(obj, dict) and isinstance(obj.get("type"), str), obj
        if obj["type"] == "error" or "error" in obj and obj.get("type") is None:
            errors += 1
            rest = [e for e in events[i + 1:] if "[DONE]" not in e]
            assert not rest, f"an error event must end the stream: {rest[:2]}"
        elif obj["type"] == "response.output_text.delta":
            got.append(obj["delta"])
    if expect is not None:
        assert errors == 0 and "".join(got) == expect


@settings(max_examples=max(200, EXAMPLES // 4), deadline=None, database=None,
          derandomize="HOSTILE_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(responses_behaviours())
def test_any_responses_stream_is_relayed_scrubbed_and_well_formed(upstream, client, case):
    script, expect = case
    note(f"expect={expect!r} script={script.pieces!r}")
    upstream.script = script
    try:
        resp = client.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True})
    except httpx.TransportError as exc:
        pytest.fail(f"the gateway dropped the connection ({exc!r}) for {script.pieces!r}")
    check_responses_stream(resp, expect)


def message_events(parts: list[str]) -> list[dict]:
    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
             "stop_reason": None, "usage": {"input_tokens": 3, "output_tokens": 0}}
    out = [{"type": "message_start", "message": start},
           {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    out += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}} for p in parts]
    out += [{"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
            {"type": "message_stop"}]
    return out


@st.composite
def messages_behaviours(draw):
    """An Anthropic Messages stream: valid, with a wrong event spliced in, with an error event, or cut."""
    parts = draw(st.lists(TEXT, max_size=4))
    events: list[dict | bytes] = list(message_events(parts))
    kind = draw(st.sampled_from(["valid", "valid", "wrong", "error", "garbage"]))
    expect: str | None = "".join(parts) if kind == "valid" else None
    at = draw(st.integers(1, len(events) - 1))
    if kind == "wrong":
        events.insert(at, json.dumps(draw(WRONG_SHAPES | st.just({"no": "type"}))).encode())
    elif kind == "error":
        events.insert(at, {"type": "error", "error": {"type": "api_error", "message": draw(SECRET_TEXTS)}})
    elif kind == "garbage":
        events.insert(at, draw(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b)))
    return typed_stream_script(draw, events, expect)


def messages_answer(upstream, client, script, expect: str | None, model: str, stream: bool) -> str | None:
    """A Messages request against `script`: the connection kept, no secret, no 500; the answer's text when
    it is a 200, else None once it is checked to be an error in Anthropic's shape."""
    upstream.script = script
    try:
        resp = client.post("/v1/messages", json={"model": model, "max_tokens": 8, "stream": stream,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    except httpx.TransportError as exc:
        pytest.fail(f"the gateway dropped the connection ({exc!r}) for {script.pieces!r}")
    text = resp.text
    assert SECRET not in text and SECRET[:12] not in text, text[:300]
    assert resp.status_code != 500, text[:300]
    if resp.status_code != 200:
        assert expect is None and resp.json()["type"] == "error" and resp.json()["error"]["message"]
        return None
    return text


@settings(max_examples=max(200, EXAMPLES // 4), deadline=None, database=None,
          derandomize="HOSTILE_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(messages_behaviours())
def test_any_messages_stream_is_relayed_scrubbed_and_well_formed(upstream, client, case):
    script, expect = case
    note(f"expect={expect!r} script={script.pieces!r}")
    text = messages_answer(upstream, client, script, expect, "m", True)
    if text is None:
        return
    events = [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]
    got, errors = [], 0
    for i, event in enumerate(events):
        data = [line[5:].strip() for line in event.split("\n") if line.startswith("data:")]
        if not data:
            continue
        obj = json.loads(data[0])  # every event the client gets is JSON with a type
        assert isinstance(obj, dict) and isinstance(obj.get("type"), str), obj
        if obj["type"] == "error":
            errors += 1
            assert not events[i + 1:], f"an error event must end the stream: {events[i + 1:][:2]}"
            assert obj["error"]["message"]
        elif obj["type"] == "content_block_delta":
            got.append(obj["delta"]["text"])
    if expect is not None:
        assert errors == 0 and "".join(got) == expect


@settings(max_examples=max(200, EXAMPLES // 4), deadline=None, database=None,
          derandomize="HOSTILE_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(behaviours())
def test_any_chat_upstream_behind_a_translated_messages_request_gives_anthropics_shapes(upstream, client, case):
    """Anthropic Messages on an SGLang lane: whatever the engine's chat answer does, the client gets a
    Message or a Messages stream (its text as the engine's), or an error in Anthropic's shape."""
    stream, script, expect = case
    note(f"stream={stream} expect={expect!r} script={script.pieces!r}")
    text = messages_answer(upstream, client, script, expect, "m-sg", stream)
    if text is None:
        return
    if not stream:
        message = json.loads(text)
        assert message["type"] == "message" and message["role"] == "assistant", message
        if expect is not None:
            assert "".join(b.get("text", "") for b in message["content"]) == expect
        return
    events = [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]
    got, kinds = [], []
    for i, event in enumerate(events):
        data = [line[5:].strip() for line in event.split("\n") if line.startswith("data:")]
        if not data or data[0] == "[DONE]":
            continue
        obj = json.loads(data[0])
        assert isinstance(obj, dict) and isinstance(obj.get("type"), str), obj
        kinds.append(obj["type"])
        if obj["type"] == "error":
            assert expect is None and obj["error"]["message"], obj
            assert all(d.startswith("data: [DONE]") for d in events[i + 1:]), events[i + 1:][:2]
        elif obj["type"] == "content_block_delta" and obj["delta"]["type"] == "text_delta":
            got.append(obj["delta"]["text"])
    if expect is not None:
        assert "".join(got) == expect and kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"model": "m", "input": "hi"}),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/embeddings", {"model": "m", "input": "hi"}),
    ("/tokenize", {"model": "m", "prompt": "hi"}),
])
@pytest.mark.parametrize("answer", [
    b"\x00\xff\xfe", b"[1, 2]", b'{"error": {"message": "Bearer ' + SECRET.encode() + b'", "code": null}}',
    b'{"object": "error", "message": "invalid key ' + SECRET.encode() + b'"}',
])
def test_json_passthrough_paths_scrub_and_check_what_they_relay(upstream, client, path, body, answer):
    upstream.script = Script([http_response(200, answer, [("Content-Type", "application/json")], "length")])
    resp = client.post(path, json=body)
    assert SECRET not in resp.text and SECRET[:12] not in resp.text, resp.text
    assert resp.status_code == 502 and resp.json()["error"]["message"], resp.text


# -- after the storm -----------------------------------------------------------------------------------

def test_the_gateway_still_serves_and_kept_no_secret(upstream, client, gateway):
    """Runs after the property test (file order): nothing in flight, nothing logged or recorded
    with the lane's key, no traceback, and a well-behaved upstream is served normally."""
    upstream.script = Script([http_response(200, json.dumps(completion("fine")).encode(),
                                            [("Content-Type", "application/json")])])
    resp = client.post("/v1/chat/completions", json=REQUEST)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "fine"
    seen = upstream.requests[-1]
    assert seen.headers.get("accept-encoding") == "identity"
    assert seen.headers.get("authorization") == f"Bearer {SECRET}"
    headers = {"Authorization": f"Bearer {ADMIN}"}

    def inflight() -> list[int]:
        lanes = client.get("/admin/api/overview?probe=0", headers=headers).json()["lanes"]
        return [lanes[0]["inflight"]] + [r["inflight"] for r in lanes[0]["replicas"]]

    wait_until(lambda: inflight() == [0, 0], what="nothing in flight", detail=lambda: inflight())
    records = client.get("/admin/api/records?limit=5000", headers=headers)
    assert records.status_code == 200 and SECRET not in records.text and SECRET[:12] not in records.text
    log = gateway.log()
    assert SECRET not in log and SECRET[:12] not in log
    assert "Traceback" not in log, log[-3000:]


# -- single cases worth naming --------------------------------------------------------------------------

def _ask(client, stream=False):
    return client.post("/v1/chat/completions", json={**REQUEST, "stream": stream})


def test_upstream_401_is_a_502_upstream_auth_failed_without_the_key(upstream, client):
    upstream.script = Script([http_response(401, json.dumps({"error": {"message": f"bad key {SECRET}"}}).encode())])
    resp = _ask(client)
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "upstream_auth_failed"
    assert SECRET not in resp.text


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
@pytest.mark.parametrize("stream", [False, True])
def test_compressed_answers_are_decoded(upstream, client, coding, stream):
    if stream:
        body = sse([json.dumps(c).encode() for c in chunks(["Hel", "lo"])] + [b"[DONE]"], b"\n", b"data: ")
    else:
        body = json.dumps(completion("Hello")).encode()
    wire = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress}[coding](body)
    ctype = "text/event-stream" if stream else "application/json"
    upstream.script = Script([http_response(200, wire, [("Content-Type", ctype), ("Content-Encoding", coding)],
                                            "chunked")])
    resp = _ask(client, stream)
    check_answer(resp, stream, "Hello")


def test_a_huge_line_ends_the_stream_with_an_error_event(upstream, client):
    good = sse([json.dumps(c).encode() for c in chunks(["a"])[:2]], b"\n", b"data: ")
    huge = b"data: " + b"x" * (9 * 1024 * 1024)  # no end of line, past the 8 MiB event bound
    upstream.script = Script([http_response(200, good + huge, [("Content-Type", "text/event-stream")], "close")])
    resp = _ask(client, True)
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["error"]["code"] == "upstream_bad_response"


def test_wrong_shape_chunk_ends_the_stream_cleanly(upstream, client):
    events = [json.dumps(c).encode() for c in chunks(["a"])]
    events.insert(2, b'{"choices":[1]}')
    upstream.script = Script([http_response(200, sse(events + [b"[DONE]"], b"\n", b"data: "),
                                            [("Content-Type", "text/event-stream")], "chunked")])
    resp = _ask(client, True)
    last = [e for e in resp.text.split("\n\n") if e][-2:]
    assert last[1] == "data: [DONE]" and json.loads(last[0][6:])["error"]["code"] == "upstream_bad_response"


def test_wrong_shape_whole_answer_is_a_502(upstream, client):
    upstream.script = Script([http_response(200, b'{"choices":[1]}', [("Content-Type", "application/json")])])
    resp = _ask(client)
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_bad_response"


def test_midstream_error_event_is_scrubbed_and_ends_the_stream(upstream, client):
    events = [json.dumps(c).encode() for c in chunks(["a"])[:2]]
    events.append(json.dumps({"error": {"message": f"engine died; key {SECRET}", "type": "BadRequestError",
                                        "code": 400}}).encode())
    upstream.script = Script([http_response(200, sse(events, b"\n", b"data: "),
                                            [("Content-Type", "text/event-stream")], "close")])
    resp = _ask(client, True)
    assert SECRET not in resp.text
    last = [e for e in resp.text.split("\n\n") if e][-2:]
    assert last[1] == "data: [DONE]" and "engine died" in json.loads(last[0][6:])["error"]["message"]


def test_the_final_blank_line_cut_off_still_completes(upstream, client):
    body = sse([json.dumps(c).encode() for c in chunks(["ok"])], b"\n", b"data: ") + b"data: [DONE]\n"
    upstream.script = Script([http_response(200, body, [("Content-Type", "text/event-stream")], "close")])
    check_answer(_ask(client, True), True, "ok")


def test_the_final_blank_line_cut_off_ends_a_translated_messages_stream_as_anthropic_does(upstream, client):
    body = sse([json.dumps(c).encode() for c in chunks(["ok"])], b"\n", b"data: ") + b"data: [DONE]\n"
    script = Script([http_response(200, body, [("Content-Type", "text/event-stream")], "close")])
    text = messages_answer(upstream, client, script, "ok", "m-sg", True)
    events = [e for e in (text or "").split("\n\n") if e.strip()]
    assert "[DONE]" not in text and json.loads(events[-1].split("data:", 1)[1])["type"] == "message_stop", events[-3:]


def test_data_after_done_is_not_relayed(upstream, client):
    body = sse([json.dumps(c).encode() for c in chunks(["ok"])] + [b"[DONE]", b'{"choices":[1]}'],
               b"\n", b"data: ")
    upstream.script = Script([http_response(200, body, [("Content-Type", "text/event-stream")], "chunked")])
    resp = _ask(client, True)
    check_answer(resp, True, "ok")
    assert '"choices":[1]' not in resp.text



def test_an_event_split_over_several_data_lines_reaches_the_client_as_one_line(upstream, client):
    pretty = json.dumps(chunks(["multi"])[1], indent=1).encode().split(b"\n")
    event = b"event: message\nid: 7\n" + b"\n".join(b"data: " + line for line in pretty) + b"\n\n"
    body = event + sse([json.dumps(c).encode() for c in chunks([])[2:]] + [b"[DONE]"], b"\n", b"data: ")
    upstream.script = Script([http_response(200, body, [("Content-Type", "text/event-stream")], "chunked")])
    check_answer(_ask(client, True), True, "multi")


def test_text_completions_are_checked_too(upstream, client):
    ok = {"id": "cmpl-1", "object": "text_completion",
          "choices": [{"index": 0, "text": "done", "finish_reason": "stop"}]}
    upstream.script = Script([http_response(200, json.dumps(ok).encode(), [("Content-Type", "application/json")])])
    resp = client.post("/v1/completions", json={"model": "m", "prompt": "a", "max_tokens": 3})
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "done"
    bad = {"choices": [{"index": 0, "text": ["not", "text"]}]}
    upstream.script = Script([http_response(200, json.dumps(bad).encode(), [("Content-Type", "application/json")])])
    resp = client.post("/v1/completions", json={"model": "m", "prompt": "a", "max_tokens": 3})
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_bad_response"
    events = [json.dumps({"choices": [{"index": 0, "text": t, "finish_reason": None}]}).encode() for t in ("do", "ne")]
    upstream.script = Script([http_response(200, sse(events + [b"[DONE]"], b"\n", b"data: "),
                                            [("Content-Type", "text/event-stream")], "chunked")])
    resp = client.post("/v1/completions", json={"model": "m", "prompt": "a", "max_tokens": 3, "stream": True})
    texts = [json.loads(e[5:])["choices"][0]["text"] for e in resp.text.split("\n\n") if e and "[DONE]" not in e]
    assert texts == ["do", "ne"] and resp.text.endswith("data: [DONE]\n\n")


def test_a_first_chunk_carrying_a_long_prompts_ids_is_relayed(upstream, client):
    """vLLM's first chunk holds every prompt id when they are asked for (the gateway asks for them):
    ~7 bytes per token, 10 MB for a 1.4M-token prompt, past the fixed 8 MiB bound of an event. The
    bound grows with the request (at most a token per byte of the body)."""
    words = 1_400_000
    first, *rest = chunks(["a"])
    ids = b"[" + b",".join(b"%d" % (100000 + i % 29000) for i in range(words)) + b"]"
    head = json.dumps(first).encode()
    big = head[:-1] + b', "prompt_token_ids": ' + ids + b"}"
    assert len(big) > 9 * 1024 * 1024
    body = sse([big] + [json.dumps(c).encode() for c in rest] + [b"[DONE]"], b"\n", b"data: ")
    upstream.script = Script([http_response(200, body, [("Content-Type", "text/event-stream")], "chunked")])
    prompt = " ".join("w" for _ in range(words // 2))  # ~1.4 MB of text: ~1.4M tokens at most
    resp = client.post("/v1/chat/completions", json={**REQUEST, "stream": True,
                                                     "messages": [{"role": "user", "content": prompt}]})
    check_answer(resp, True, "a")
