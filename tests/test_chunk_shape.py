"""Token chunks recognised from their bytes (chunk_shape.py) decide exactly as the parse does.

Every case runs one stream through two observers: one that learns shapes, one that parses every event.
They must relay the same bytes, raise the same errors and record the same output, usage and timings.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.relay import chunk_shape
from gateway.core.exchange import Exchange
from gateway.relay.sse import BadStream, EventSplitter, StreamObserver

from tests.support.stream_events import (ENCODE, EXTRAS, KEYS, TEXT, assert_same_record, chunk, encode, hostile,
                                         token_event)

FIXTURES = Path("/work/shared/fixtures/upstream")


def _run(events: list[bytes], learn: bool, strip_ids: bool) -> tuple[list, Exchange, StreamObserver]:
    ex = Exchange("r")
    observer = StreamObserver(ex, drop_usage_chunk=True, strip_ids=strip_ids, learn_shapes=learn)
    out: list = []
    for event in events:
        try:
            out.append(observer.relay(event))
        except BadStream as exc:
            out.append(("bad", exc.code, exc.message))
        if observer.done:
            break
    return out, ex, observer


def _same(events: list[bytes], strip_ids: bool = False) -> StreamObserver:
    fast_out, fast, observer = _run(events, True, strip_ids)
    slow_out, slow, _ = _run(events, False, strip_ids)
    assert fast_out == slow_out
    assert_same_record(fast, slow)
    return observer


@pytest.mark.parametrize("fixture", ["vllm_stream_deepseek.sse", "sglang_stream_deepseek.sse"])
def test_engine_streams_are_recognised(fixture):
    events = EventSplitter().feed((FIXTURES / fixture).read_bytes() + b"\n\n")
    observer = _same(events)
    kinds = {shape.kind for shape in observer.shapes}
    assert {chunk_shape.CONTENT, chunk_shape.REASONING} <= kinds


def test_a_tool_calls_arguments_are_recognised():
    events = EventSplitter().feed((FIXTURES / "vllm_stream_deepseek.sse").read_bytes() + b"\n\n")
    observer = _same(events)
    assert any(shape.kind == chunk_shape.ARGUMENTS for shape in observer.shapes)


def test_the_probe_refuses_a_slot_found_elsewhere():
    # The delta's text is escaped; the same words appear unescaped in another field: the search finds
    # the other field, and the probe (the shape filled with another text) shows it is not the delta's.
    event = (b'data: {"id":"x","extra":{"content":"hi"},"choices":[{"index":0,'
             b'"delta":{"content":"\\u0068i"},"finish_reason":null}]}\n\n')
    parsed = orjson.loads(event[5:])
    assert parsed["choices"][0]["delta"]["content"] == "hi"
    assert chunk_shape.learn(event, parsed) is None


def test_a_text_seen_twice_is_not_learnt():
    event = (b'data: {"id":"x","extra":{"content":"hi"},"choices":[{"index":0,'
             b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
    assert chunk_shape.learn(event, orjson.loads(event[5:])) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), EXTRAS, ENCODE, st.booleans(),
       st.lists(st.tuples(KEYS, TEXT, st.integers(0, 9), st.none() | st.lists(st.integers(0, 99999), max_size=3)),
                min_size=1, max_size=24))
def test_recognised_chunks_decide_as_the_parse(data, extras, how, strip_ids, tokens):
    events = [encode(chunk({"role": "assistant", "content": ""}, extras), how)]
    for key, text, mutate, ids in tokens:
        event = token_event(key, text, extras, how, ids)
        if mutate == 0:
            event = hostile(event, data)
        elif mutate == 1:  # another chunk in the stream's usual shape: a finish reason, the usage
            event = encode(chunk({}, extras, finish="stop"), how)
        elif mutate == 2:
            event = event.replace(b"data: ", b"data:", 1)
        events.append(event)
    events.append(b"data: [DONE]\n\n")
    _same(events, strip_ids)


def test_chunks_with_token_ids_are_recognised_once_the_ids_are_out():
    # vLLM asked for ids sends them in every chunk: taken out first, the rest has one shape.
    extras = {"id": "chatcmpl-1", "model": "m"}
    events = [encode(chunk({"role": "assistant", "content": ""}, extras | {"token_ids": None}, ids=[1]), "orjson")]
    events += [token_event("content", f"w{i} ", extras | {"token_ids": None}, "orjson", [i, i + 1]) for i in range(40)]
    events.append(b"data: [DONE]\n\n")
    observer = _same(events, strip_ids=True)
    assert [s.kind for s in observer.shapes] == [chunk_shape.CONTENT]
    _, ex, _ = _run(events, True, True)
    assert ex.generated.token_ids[:4] == [1, 0, 1, 1]
