"""pipeline.set_headers leaves a response's headers exactly as `response.headers[k] = v`, one by one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import Response

from gateway.pipeline.flow import set_headers

names = st.sampled_from(["X-Request-Id", "x-request-id", "X-Gateway-Effort", "X-Gateway-Conversation",
                         "content-type", "Content-Length", "X-Other"])
values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(names, values), max_size=4), st.lists(st.tuples(names, values), max_size=5))
def test_as_assigned_one_by_one(existing: list, pairs: list) -> None:
    ours, theirs = Response(b"{}", media_type="application/json"), Response(b"{}", media_type="application/json")
    for k, v in existing:  # what the relay may have set already, repeats included
        for r in (ours, theirs):
            r.raw_headers.append((k.lower().encode(), v.encode()))
    set_headers(ours, pairs)
    for k, v in pairs:
        theirs.headers[k] = v
    assert ours.raw_headers == theirs.raw_headers
