"""Answer.set_headers leaves the headers exactly as Starlette's `response.headers[k] = v` would, one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import Response

from gateway.core.answer import Answer

names = st.sampled_from(["X-Request-Id", "x-request-id", "X-Gateway-Effort", "X-Gateway-Conversation",
                         "content-type", "Content-Length", "X-Other"])
values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(names, values), max_size=4), st.lists(st.tuples(names, values), max_size=5))
def test_as_assigned_one_by_one(existing: list, pairs: list) -> None:
    ours, theirs = Answer.json(200, b"{}"), Response(b"{}", media_type="application/json")
    theirs.raw_headers = list(ours.headers)
    for k, v in existing:  # what the relay may have set already, repeats included
        ours.headers.append((k.lower().encode(), v.encode()))
        theirs.raw_headers.append((k.lower().encode(), v.encode()))
    ours.set_headers(pairs)
    for k, v in pairs:
        theirs.headers[k] = v
    assert ours.headers == theirs.raw_headers
