"""WireHeaders (gateway/server/wire.py) answers every lookup as starlette's Headers does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from gateway.server.wire import WireHeaders

names = st.sampled_from([b"host", b"authorization", b"x-request-id", b"content-length", b"user-agent", b"a",
                         b"x-conversation-id"])
values = st.binary(max_size=12)
keys = st.sampled_from(["Host", "AUTHORIZATION", "x-request-id", "Content-Length", "A", "a", "missing",
                        "X-Conversation-Id", "é", "ĉ"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(names, values), max_size=10), st.lists(keys, min_size=1, max_size=6))
def test_lookups_read_as_starlettes(raw: list, asked: list) -> None:
    ours, theirs = WireHeaders({"headers": list(raw)}), Headers(scope={"headers": list(raw)})
    for key in asked:
        for look in (lambda h, k=key: h.get(k), lambda h, k=key: h.get(k, "d"), lambda h, k=key: k in h,
                     lambda h, k=key: h[k]):
            try:
                expected = ("ok", look(theirs))
            except (KeyError, UnicodeEncodeError) as exc:
                expected = ("raise", type(exc))
            if expected[0] == "ok":
                assert look(ours) == expected[1]
            else:
                with pytest.raises(expected[1]):
                    look(ours)
    assert ours.raw == theirs.raw and list(ours.items()) == list(theirs.items())
