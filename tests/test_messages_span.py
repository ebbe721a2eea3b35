"""A large body read in three parts (gateway/pipeline/messages_span.py) reads exactly as orjson.loads reads it,
and the span it gives is the messages array's own bytes; anything odd gives None (the whole parse)."""

from __future__ import annotations

import json
import random
import sys

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.pipeline import messages_span
from gateway.pipeline.body_parts import Parts
from gateway.pipeline.history_memo import MIN_BYTES, HistoryMemo

from tests.support.agent_bodies import agent_body, body_message, dump_styled


def _check(raw: bytes) -> tuple[int, int] | None:
    """split(raw) is None, or the whole parse with the span of the messages array."""
    try:
        whole = orjson.loads(raw)
    except orjson.JSONDecodeError:
        whole = None
    got = messages_span.split(raw)
    if got is None:
        return None
    data, bracket, close = got.data, got.bracket, got.close
    assert whole is not None, "split read a body the whole parse refuses"
    assert data == whole and list(data) == list(whole)  # values and key order
    assert raw[bracket:bracket + 1] == b"[" and raw[close:close + 1] == b"]"
    assert orjson.loads(raw[bracket:close + 1]) == whole["messages"]
    if got.others is not None:  # the client's body may be forwarded as it is: no key given twice
        keys = []
        json.loads(raw, object_pairs_hook=lambda pairs: keys.append([k for k, _ in pairs]) or dict(pairs))
        assert len(keys[-1]) == len(set(keys[-1])) == len(whole)
        assert got.others == (orjson.dumps({k: v for k, v in whole.items() if k != "messages"}),
                              list(whole).index("messages"))
    return bracket, close


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(style=st.integers(0, 3), layout=st.integers(0, 2), n=st.integers(40, 70))
def test_the_formats_clients_write_are_split(style: int, layout: int, n: int) -> None:
    raw = dump_styled(agent_body(n, layout), style)
    assert _check(raw) is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(style=st.integers(0, 3), layout=st.integers(0, 2), seed=st.integers(0, 2**32),
       junk=st.sampled_from([b"]", b"}", b"[", b"{", b'"', b"\\", b",", b'"role":', b'"messages":[]',
                             b"],", b"]}", b' "a"', b"\\\\", b'\\"']))
def test_a_mutated_tail_is_split_exactly_or_not_at_all(style: int, layout: int, seed: int, junk: bytes) -> None:
    raw = dump_styled(agent_body(40, layout), style)
    rng = random.Random(seed)
    at = len(raw) - rng.randrange(1, 3000)  # somewhere in the last messages or the fields after them
    mutated = raw[:at] + junk + raw[at:]
    _check(mutated)


@pytest.mark.parametrize("tail", [
    b', "messages": [{"role": "user", "content": "only me"}]}',  # a second key, after: it wins
    b', "m\\u0065ssages": [{"role": "user", "content": "escaped"}]}',
    b', "messages": "x"}',
    b', "messages": []}',
    b', "\\u006dessages": 0}',
])
def test_a_later_messages_key_is_never_overruled(tail: bytes) -> None:
    raw = dump_styled(agent_body(40, 2), 0).rstrip()[:-1] + tail
    assert _check(raw) is None
    assert messages_span.split(raw) is None or messages_span.split(raw)[0] == orjson.loads(raw)


def test_an_earlier_messages_key_is_overruled_as_the_whole_parse_does() -> None:
    body = agent_body(40, 0)
    raw = b'{"messages": [{"role": "user", "content": "old"}], ' + dump_styled(body, 0)[1:]
    assert orjson.loads(raw)["messages"] == body["messages"]
    _check(raw)


def test_tools_after_the_messages_are_skipped_and_a_role_in_a_string_misleads_nothing() -> None:
    body = agent_body(40, 0)
    body["tools"] = body["tools"] * 30 + [{"type": "function", "function": {"name": "x", "description":
                                           '"role": [{"role": "user"}] \\" ] } "role":'}}]
    body["messages"][-1]["content"] = '], "role": "x"}] {"role": ['
    for style in range(4):
        assert _check(dump_styled(body, style)) is not None


def test_not_an_object_or_broken_or_trailing_bytes_is_the_whole_parse() -> None:
    raw = dump_styled(agent_body(40, 1), 0)
    for bad in (b"[" + raw + b"]", raw + b"x", raw[:-1], raw + b"}", raw[:-1] + b',}', raw + b' {"a":1}'):
        assert _check(bad) is None


@pytest.mark.parametrize("depth", [250, 254, 255, 1024, 1025, 1026])  # of the whole body
def test_nesting_reads_as_the_whole_parse_up_to_where_orjson_writes(depth: int) -> None:
    """orjson reads 1,024 levels and writes 254. Up to 254 levels (the whole body) everything is as
    the whole parse and serialise; deeper, the messages are forwarded as the client wrote them (as
    the memo's later turns already were) instead of refused, and at exactly 1,025 they are read
    where the whole parse refuses them (messages_span.py's docstring)."""
    body = agent_body(40, 0)
    deep = b"[" * (depth - 3) + b"1" + b"]" * (depth - 3)  # in the body: {messages: [{x: deep}]}
    raw = dump_styled(body, 0).replace(b'"role":"system"', b'"x":' + deep + b',"role":"system"', 1)
    assert len(raw) >= MIN_BYTES
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # comparing 1,000 levels of lists
    try:
        try:
            whole = orjson.loads(raw)
        except orjson.JSONDecodeError:
            whole = None
        assert (whole is None) == (depth > 1024)
        if depth > 1025:
            with pytest.raises(orjson.JSONDecodeError):
                HistoryMemo().parse(raw)
            return
        parsed = HistoryMemo().parse(raw)
        assert parsed.fresh is not None
        if whole is not None:
            assert parsed.data == whole
        forwarded = HistoryMemo.serialise(parsed, dict(parsed.data))
        assert forwarded == raw  # nothing rewritten: the client's body
        if depth <= 254:
            assert orjson.dumps(parsed.data)  # what the ordinary serialise would have sent
    finally:
        sys.setrecursionlimit(limit)


def test_a_key_given_twice_or_a_rewritten_field_is_never_forwarded_as_the_client_wrote_it() -> None:
    memo = HistoryMemo()
    raw = dump_styled(agent_body(40, 1), 3)
    twice = raw.replace(b'"model":"m"', b'"model":"x","model":"m"', 1)
    for body, same in ((raw, True), (twice, False)):
        parsed = memo.parse(body)
        out = dict(parsed.data)
        forwarded = HistoryMemo.serialise(parsed, out)
        assert (forwarded is body) is same and orjson.loads(forwarded) == orjson.loads(body)
        out["model"] = "upstream"
        forwarded = HistoryMemo.serialise(parsed, out)
        assert forwarded != body and orjson.loads(forwarded) == {**orjson.loads(body), "model": "upstream"}
        # What is forwarded: the new fields around the client's own bytes of its messages, in place.
        parts = HistoryMemo.forward_body(parsed, out)
        assert isinstance(parts, Parts) and bytes(parts) == forwarded and len(parts) == len(forwarded)
        assert any(isinstance(b, memoryview) and b.obj is body for b in parts.buffers)
        out["model"] = "m"
        out["stream"] = True
        assert orjson.loads(HistoryMemo.serialise(parsed, out)) == {**orjson.loads(body), "stream": True}


def test_a_first_seen_body_forwards_its_own_bytes_and_is_filed_settled() -> None:
    memo = HistoryMemo()
    body = agent_body(60, 0)
    raw = json.dumps(body, indent=2).encode()
    parsed = memo.parse(raw)
    assert parsed.fresh is not None and parsed.fresh is parsed.pending
    forwarded = HistoryMemo.serialise(parsed, dict(parsed.data))
    assert forwarded is not None and raw[parsed.fresh.open - 1:parsed.fresh.cut] in forwarded
    assert orjson.loads(forwarded) == orjson.loads(raw)
    memo.settle(parsed)
    body["messages"].append(body_message(60))
    again = memo.parse(json.dumps(body, indent=2).encode())
    assert again.known == 60 and again.data == body


def test_a_long_last_message_full_of_escaped_quotes_is_read_in_linear_time() -> None:
    """A string cut by the backwards window once made every quote inside it restart the scan
    (seconds for 64 KB of quoted JSON); now the window gives up, and the body is parsed whole."""
    import time

    for size in (3_000, 12_000, 1_000_000):
        body = agent_body(40, 0)
        body["messages"].append({"role": "tool", "tool_call_id": "c1", "content": 'x\\"]}{"' * (size // 6)})
        raw = orjson.dumps(body)
        t = time.process_time()
        _check(raw)
        assert time.process_time() - t < 0.2, size
