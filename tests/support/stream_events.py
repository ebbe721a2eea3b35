"""Stream events as engines send them, for the relay's tests (chunk_shape, chunk_run)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import strategies as st


def chunk(delta: dict, extras: dict, finish: str | None = None, ids: list[int] | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if "token_ids" in extras:  # vLLM asked for ids: every choice says them, or null
        choice["token_ids"] = ids
    return {**extras, "object": "chat.completion.chunk", "choices": [choice]}


KEYS = st.sampled_from(["content", "reasoning_content", "reasoning", "tool"])
TEXT = st.text(max_size=12) | st.sampled_from(["", "a", " b", 'q"uote', "back\\slash", "\n", "\x00", "é", "😀"])
EXTRAS = st.fixed_dictionaries({}, optional={
    "id": st.just("chatcmpl-1"), "created": st.just(1767225600), "model": st.sampled_from(["m", "con\"tent"]),
    "system_fingerprint": st.none(), "prompt_token_ids": st.none(), "token_ids": st.none()})
ENCODE = st.sampled_from(["orjson", "ascii", "spaced"])


def encode(body: dict, how: str) -> bytes:
    if how == "orjson":
        payload = orjson.dumps(body)
    elif how == "ascii":
        payload = json.dumps(body, separators=(",", ":")).encode()
    else:
        payload = json.dumps(body, ensure_ascii=False).encode()
    return b"data: " + payload + b"\n\n"


def token_event(key: str, text: str, extras: dict, how: str, ids: list[int] | None) -> bytes:
    if key == "tool":
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
    else:
        delta = {key: text}
    extras = {k: v for k, v in extras.items() if k != "token_ids"}
    body = chunk(delta, extras | ({"token_ids": None} if "token_ids" in extras or ids is not None else {}), ids=ids)
    return encode(body, how)


def hostile(event: bytes, data: st.DataObject) -> bytes:
    """The same event with its text's bytes broken: a raw quote, a control byte, invalid UTF-8."""
    cut = event.rfind(b'"}')
    if cut < 0:
        return event
    bad = data.draw(st.sampled_from([b'"', b"\n", b"\x01", b"\xff", b"\xed\xa0\x80", b"\\", b"\\q"]))
    return event[:cut] + bad + event[cut:]


def assert_same_record(fast: Any, slow: Any) -> None:
    """Two exchanges that relayed one stream two ways recorded the same: output, usage, token timings."""
    assert fast.generated == slow.generated
    assert fast.usage == slow.usage
    assert len(fast.token_chunk_times) == len(slow.token_chunk_times)
    assert (fast.t_first_token is None) == (slow.t_first_token is None)
