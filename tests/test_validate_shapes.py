"""check_chat's shortcut for the common message shapes (validate.py) refuses and accepts exactly what the
general per-message check does, with the same error."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import GatewayError
from gateway.pipeline.validate import _check_message, check_chat

_values = st.one_of(st.sampled_from(["user", "assistant", "tool", "system", "developer", "function", ""]),
                    st.none(), st.integers(0, 2), st.lists(st.just("x"), max_size=1),
                    st.just([{"type": "text", "text": "hi"}]), st.just({"a": 1}), st.text(max_size=3))
_keys = st.sampled_from(["role", "content", "tool_call_id", "name", "reasoning_content", "tool_calls", "x"])
_message = st.one_of(st.dictionaries(_keys, _values, max_size=4), st.none(), st.integers(), st.just([]))


def _outcome(fn, *args) -> tuple[int, str | None, str | None] | None:
    try:
        fn(*args)
    except GatewayError as exc:
        return exc.status, exc.code, exc.message
    return None


def _reference(body: dict) -> None:
    for i, m in enumerate(body["messages"]):
        _check_message(i, m)


@settings(max_examples=400, deadline=None)
@given(st.lists(_message, min_size=1, max_size=5))
def test_the_shortcut_decides_as_the_general_check(messages: list) -> None:
    body = {"model": "m", "messages": messages}
    assert _outcome(check_chat, body) == _outcome(_reference, body)
