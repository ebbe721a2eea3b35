"""Runs of token chunks (chunk_run.py) relay and record exactly what the event-by-event relay does.

Each case is one stream, cut into reads at drawn places, relayed twice as relay/stream.py relays it: once
event by event with every chunk parsed (no shapes learnt), once with runs after the first event. The
client's bytes, the errors, the recorded output, usage and the number of token timestamps must agree,
whatever the reshaper rewrites (the public model name, the id prefix, the reasoning field).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.relay.chunk_run import Runs
from gateway.core.exchange import Exchange
from gateway.relay.reshape import Reshaper
from gateway.relay.sse import BadStream, EventSplitter, StreamObserver
from tests.support.stream_events import (ENCODE, EXTRAS, KEYS, TEXT, assert_same_record, chunk, encode, hostile,
                                         token_event)


class CountingObserver(StreamObserver):
    __slots__ = ("relayed",)

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.relayed = 0

    def relay(self, event: bytes) -> bytes | None:
        self.relayed += 1
        return super().relay(event)


def _relay(reads: list[bytes], runs: bool, reshape: tuple[Any, Any, Any], strip_ids: bool = False
           ) -> tuple[bytes, Any, Exchange, CountingObserver]:
    ex = Exchange("r")
    observer = CountingObserver(ex, drop_usage_chunk=True, strip_ids=strip_ids, learn_shapes=runs)
    shape = Reshaper(ex, *reshape).event
    run = Runs(observer, shape) if runs else None
    splitter = EventSplitter()
    sent = False
    client: list[bytes] = []
    error = None
    try:
        for i, data in enumerate(reads):
            final = i == len(reads) - 1
            out: list[bytes] = []
            if sent and run is not None:
                run.relay_read(splitter, data, final, out)
            else:
                for event in splitter.feed(data, final=final):
                    piece = observer.relay(event)
                    if piece is not None:
                        out.append(shape(piece))
                        sent = True
                    if observer.done:
                        break
            client += out
            if observer.done:
                break
    except BadStream as exc:
        error = (exc.code, exc.message)
    return b"".join(client), error, ex, observer


def _same(reads: list[bytes], reshape: tuple[Any, Any, Any], strip_ids: bool = False) -> CountingObserver:
    fast_bytes, fast_error, fast, observer = _relay(reads, True, reshape, strip_ids)
    slow_bytes, slow_error, slow, _ = _relay(reads, False, reshape, strip_ids)
    assert fast_error == slow_error
    assert fast_bytes == slow_bytes
    assert_same_record(fast, slow)
    return observer


def _cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    at = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in zip(at, at[1:])] + [b""]  # the empty read: the end of the stream


_RESHAPE = st.tuples(st.sampled_from([None, "pub", 'we"ird']),
                     st.sampled_from([None, "reasoning", "reasoning_content", "both"]),
                     st.sampled_from([None, b"chatcmpl-"]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), EXTRAS, ENCODE, _RESHAPE, st.booleans(), st.sampled_from([b"\n", b"\r\n"]),
       st.lists(st.tuples(KEYS, TEXT, st.integers(0, 12), st.none() | st.lists(st.integers(0, 99999), max_size=3)),
                min_size=1, max_size=40),
       st.lists(st.integers(0, 1 << 20), max_size=8), st.booleans())
def test_runs_relay_and_record_as_event_by_event(data, extras, how, reshape, strip_ids, newline, tokens, cuts,
                                                 grouped):
    events = [encode(chunk({"role": "assistant", "content": ""}, extras), how)]
    if grouped:  # an engine's order: the reasoning, then the answer, then the tool call (long runs)
        tokens = sorted(tokens, key=lambda t: ["reasoning_content", "reasoning", "content", "tool"].index(t[0]))
    for key, text, mutate, ids in tokens:
        event = token_event(key, text, extras, how, ids)
        if mutate == 0:
            event = hostile(event, data)
        elif mutate == 1:  # another chunk in the stream's usual shape: a finish reason
            event = encode(chunk({}, extras, finish="stop"), how)
        elif mutate == 2:
            event = event.replace(b"data: ", b"data:", 1)
        elif mutate == 3:  # a keep-alive comment, an extra blank line
            event = data.draw(st.sampled_from([b": ping\n\n", b"\n", b"\n\n"])) + event
        events.append(event)
    events.append(b"data: [DONE]\n\n")
    stream = b"".join(events)
    if newline != b"\n":
        stream = stream.replace(b"\n", newline)
    _same(_cut(stream, cuts), reshape, strip_ids)


def _plain_stream(n: int, key: str = "content", extras: dict | None = None) -> bytes:
    extras = extras or {"id": "chatcmpl-1", "created": 1, "model": "m"}
    events = [encode(chunk({"role": "assistant", "content": ""}, extras), "orjson")]
    events += [token_event(key, f"w{i} ", extras, "orjson", None) for i in range(n)]
    events += [encode(chunk({}, extras, finish="stop"), "orjson"), b"data: [DONE]\n\n"]
    return b"".join(events)


def test_a_long_run_is_relayed_at_once():
    stream = _plain_stream(256)
    reads = [stream[:300], stream[300:20_000], stream[20_000:], b""]
    observer = _same(reads, (None, None, None))
    assert observer.relayed < 12  # the first events, the boundaries' events, the finish and [DONE]
    assert "".join(observer.ex.generated.content) == "".join(f"w{i} " for i in range(256))


def test_a_renamed_model_is_relayed_at_once_reshaped():
    stream = _plain_stream(64, "reasoning_content")
    observer = _same([stream[:400], stream[400:], b""], ("public-name", "reasoning", b"chatcmpl-"))
    assert observer.relayed < 8


def test_a_copied_text_goes_event_by_event():
    # reasoning_field: both copies the text into a second key: the run's reshaped head and tail do not
    # describe it, so the shape is relayed event by event (and still the same bytes).
    stream = _plain_stream(40, "reasoning")
    observer = _same([stream[:400], stream[400:], b""], (None, "both", None))
    assert observer.relayed > 40


def test_invalid_utf8_in_a_run_goes_event_by_event():
    valid = _plain_stream(30)
    stream = valid.replace(b"w17 ", b"w\xff7 ")
    in_runs = _same([valid[:400], valid[400:], b""], (None, None, None)).relayed
    observer = _same([stream[:400], stream[400:], b""], (None, None, None))  # the same bytes either way
    assert in_runs < 8 and observer.relayed > in_runs + 10, (in_runs, observer.relayed)  # one by one, not at once


def test_runs_longer_than_the_window_and_texts_longer_than_it():
    extras = {"id": "chatcmpl-1", "created": 1, "model": "m"}
    events = [encode(chunk({"role": "assistant", "content": ""}, extras), "orjson")]
    events += [token_event("content", f"w{i} ", extras, "orjson", None) for i in range(1500)]
    events.append(token_event("content", "x" * 40_000, extras, "orjson", None))  # one chunk past the window
    events += [token_event("content", f"v{i} ", extras, "orjson", None) for i in range(300)]
    events += [encode(chunk({}, extras, finish="stop"), "orjson"), b"data: [DONE]\n\n"]
    stream = b"".join(events)
    observer = _same([stream[:500], stream[500:], b""], ("pub", None, b"chatcmpl-"))
    assert observer.relayed < 40
