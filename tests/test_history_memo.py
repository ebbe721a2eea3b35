"""The hot path's history memo (gateway/pipeline/history_memo.py) reads every body exactly as orjson.loads does.

Generated sessions in the formats clients write (compact or spaced JSON, ASCII escapes or raw UTF-8,
fields before and after `messages`, tools, nested `messages` keys), turn after turn: append-only
turns must reuse the history, and every other change (an edit anywhere, a second `messages` key,
broken JSON) must still read as the whole parse reads it.
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.pipeline.history_memo import MIN_BYTES, HistoryMemo, Parsed
from tests.support.agent_bodies import FILLER, agent_body, body_message, dump_styled


def _read(memo: HistoryMemo, raw: bytes) -> Parsed:
    """As the pipeline does: parse, and remember a first-seen body once its answer is gone."""
    parsed = memo.parse(raw)
    memo.settle(parsed)
    return parsed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(style=st.integers(0, 3), layout=st.integers(0, 2), n=st.integers(40, 80),
       steps=st.lists(st.sampled_from(["append", "append2", "same", "edit_middle", "edit_last", "edit_before",
                                       "edit_after", "dup_messages", "broken"]), min_size=1, max_size=6))
def test_every_body_reads_as_the_whole_parse(style: int, layout: int, n: int, steps: list[str]) -> None:
    memo = HistoryMemo()
    body = agent_body(n, layout)
    raw = dump_styled(body, style)
    assert len(raw) >= MIN_BYTES
    assert _read(memo, raw).data == orjson.loads(raw)
    for step in steps:
        body = json.loads(json.dumps(body))
        expect_hit = step in ("append", "append2", "same", "edit_after")
        if step == "append":
            body["messages"].append(body_message(len(body["messages"])))
        elif step == "append2":
            body["messages"] += [body_message(len(body["messages"])), body_message(len(body["messages"]) + 1)]
        elif step == "edit_middle":
            body["messages"][len(body["messages"]) // 2]["content"] += " edited"
        elif step == "edit_last":
            body["messages"][-1]["content"] += " edited"
        elif step == "edit_before":
            body["model"] = "other"
            expect_hit = layout == 0  # model comes after the messages there
        elif step == "edit_after":
            body["max_tokens"] = 99
        raw = dump_styled(body, style)
        if step == "dup_messages":
            raw = raw.rstrip()[:-1] + b', "messages": [{"role": "user", "content": "only me"}]}'
            expect_hit = False
        if step == "broken":
            raw = raw.rstrip()[:-1] + b', "x": }'
            with pytest.raises(orjson.JSONDecodeError):
                memo.parse(raw)
            continue
        before = memo.hits
        parsed = _read(memo, raw)
        assert parsed.data == orjson.loads(raw), step
        if expect_hit:
            assert memo.hits == before + 1, step
            assert parsed.known > 0
        # What the pipeline forwards (the history's own bytes) reads as the same messages.
        forwarded = HistoryMemo.serialise(parsed, dict(parsed.data)) or orjson.dumps(parsed.data)
        assert orjson.loads(forwarded) == orjson.loads(raw)


def test_small_bodies_are_just_parsed() -> None:
    memo = HistoryMemo()
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    parsed = _read(memo, raw)
    assert parsed.data == orjson.loads(raw) and parsed.fresh is None and memo.bytes == 0


def test_memory_is_bounded_and_a_conversation_keeps_one_entry() -> None:
    memo = HistoryMemo(max_bytes=3 * 200_000)
    for conv in range(6):
        body = agent_body(60, 0, {"user": f"agent-{conv}"})
        body["messages"][0]["content"] += str(conv)  # another system prompt: another head
        for _ in range(3):
            body["messages"].append(body_message(len(body["messages"])))
            _read(memo, orjson.dumps(body))
    assert memo.bytes <= memo.max_bytes
    assert len(memo._entries) <= 3


def test_shared_history_is_not_modified_by_a_copy_on_write_policy() -> None:
    memo = HistoryMemo()
    body = agent_body(60, 0)
    _read(memo, orjson.dumps(body))
    body["messages"].append(body_message(60))
    parsed = _read(memo, orjson.dumps(body))
    data = parsed.data
    messages = list(data["messages"])  # as the limits and healing do
    messages[3] = {**messages[3], "content": "rewritten"}
    data["messages"] = messages
    assert HistoryMemo.serialise(parsed, data) is None  # serialised the ordinary way, not the raw bytes
    body["messages"].append(body_message(61))
    again = _read(memo, orjson.dumps(body))
    assert again.data["messages"][3]["content"] != "rewritten"


def test_the_limits_scan_of_a_known_history_plus_the_new_messages_is_the_whole_scan() -> None:
    from gateway.limits.scan import joined, scan_chat

    tokens = ("<｜User｜>", "<think>", "[0]")
    body = agent_body(70, 1)
    body["messages"][5]["content"] = [{"type": "text", "text": "look <think>"},
                                      {"type": "image_url", "image_url": {"url": "data:,x"}}]
    body["messages"][9]["reasoning_content"] = "hmm <｜User｜>"
    for k in (1, 10, 40, 69):
        kw = dict(images=True, tokens=tokens, text=True, engine="vllm", request_level=False)
        history = scan_chat({"messages": body["messages"][:k]}, **kw)
        assert joined(history, scan_chat(body, start=k, **kw)) == scan_chat(body, **kw)


def test_through_the_gateway_a_refused_turn_is_never_taken_as_checked() -> None:
    """Turn 2 adds an invalid message (refused, 400); turn 3 repeats it and adds one: still refused,
    and a valid turn after the history memo's hits answers as usual."""
    import httpx

    from tests.support.emulator_proc import run_emulator
    from tests.support.gateway_proc import run_gateway
    from tests.support.routes import lane, routes

    with run_emulator(flavour="vllm") as emu:
        with run_gateway(routes({"l": lane(emu.url)}, {"m": "l"})) as gw:
            url = gw.url + "/v1/chat/completions"
            body = {"model": "m", "max_tokens": 4, "messages": [
                {"role": "system", "content": FILLER * 3}, *({"role": "user" if i % 2 else "assistant",
                                                            "content": f"{i} {FILLER}"} for i in range(1, 60))]}
            assert len(orjson.dumps(body)) > MIN_BYTES
            assert httpx.post(url, content=orjson.dumps(body), timeout=30).status_code == 200
            bad = {**body, "messages": [*body["messages"], {"role": 5, "content": "x"}]}
            for _ in range(2):
                r = httpx.post(url, content=orjson.dumps(bad), timeout=30)
                assert r.status_code == 400 and r.json()["error"]["param"] == "messages[60].role"
                bad = {**bad, "messages": [*bad["messages"], {"role": "user", "content": "again"}]}
            good = {**body, "messages": [*body["messages"], {"role": "user", "content": "fine"}]}
            for _ in range(3):
                r = httpx.post(url, content=orjson.dumps(good), timeout=30)
                assert r.status_code == 200, r.text
                good = {**good, "messages": [*good["messages"], r.json()["choices"][0]["message"],
                                             {"role": "user", "content": "next"}]}
