"""The heal step across a conversation's requests (gateway/heal/policy.py): what it remembers from the
previous request must never change what a request gets, only what it costs. Every request of a warm
policy is compared with a policy that never saw the conversation before (everything planned afresh):
the messages the warm one reads (repaired last time, the last two user turns, the new ones) come out
the same, and no message ever comes out other than as sent or as the fresh policy repairs it."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import orjson
import pytest

from gateway.conversations.effort import EffortChoice
from gateway.conversations.identity import lineage
from gateway.conversations.found import Found
from gateway.conversations.state import ConversationState
from gateway.core.exchange import Exchange
from gateway.heal.base import Relayed, heal_digest
from gateway.heal.book import RelayedBook
from gateway.heal.policy import HEALED_HEADER, TAIL, HealPolicy
from gateway.store.memory import MemoryStore
from tests.support.routes import lane_config

KINDS = ["arguments", "reasoning", "content", "tool_result_order", "reasoning_field"]
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def assistant(n: int) -> dict:
    args = json.dumps({"path": f"f{n}.py", "start_line": n, "end_line": n + 9})
    return {"role": "assistant", "content": f"Reading f{n}.", "reasoning_content": f"I need f{n}.py.",
            "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {"name": "read_file",
                                                                                 "arguments": args}}]}


def session(turns: int, per_user: int) -> list[dict]:
    """A system prompt, then a user message every `per_user` assistant messages, each followed by its result."""
    out = [{"role": "system", "content": "You are an agent."}]
    for n in range(turns):
        if n % per_user == 0:
            out.append({"role": "user", "content": f"Task {n // per_user}."})
        out.append(assistant(n))
        out.append({"role": "tool", "tool_call_id": f"call_{n}", "content": f"contents of f{n}.py"})
    return out


def sort_args(m: dict) -> dict:
    m = copy.deepcopy(m)
    for c in m.get("tool_calls") or ():
        c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), sort_keys=True)
    return m


def strip(m: dict) -> dict:
    return {k: v for k, v in m.items() if k != "reasoning_content"}


LANE = SimpleNamespace(name="ds", config=lane_config(heal=KINDS))


def exchange(body: dict, cid: str = "c1") -> Exchange:
    ex = Exchange("t")
    ex.thinking_applied = True
    ex.conversation = Found(ConversationState(cid, "lineage", lane="ds", turn=3), lineage(body["messages"]), False,
                            3, EffortChoice(True, None, None))
    return ex


async def book_of(messages: list[dict]) -> RelayedBook:
    book = RelayedBook(MemoryStore(), 600)
    for m in messages:
        if m["role"] == "assistant":
            book.remember("default", heal_digest(m), Relayed.from_message(m))
    return book


async def run(policy: HealPolicy, messages: list[dict], cid: str = "c1") -> tuple[list[dict], Exchange]:
    """One request through the step: the messages as forwarded, and the exchange."""
    raw = orjson.dumps({"model": "m", "messages": messages, "tools": TOOLS})
    body = orjson.loads(raw)
    ex = exchange(body, cid)
    theirs = body["messages"]
    await policy.apply(ex, LANE, body)
    # The client's list and dicts are never changed (the pipeline's history memo shares them with the
    # next turn and forwards their bytes while the body holds that very list).
    assert orjson.dumps(theirs) == orjson.dumps(orjson.loads(raw)["messages"])
    assert (body["messages"] is theirs) == (not ex.healed)
    return body["messages"], ex


async def check(book: RelayedBook, warm: HealPolicy, messages: list[dict], must_match: bool = True) -> list[dict]:
    """Send `messages` through the warm policy and through a fresh one; every message the warm policy
    forwards is the client's or the fresh one's; with `must_match`, all of them are the fresh one's."""
    got, ex = await run(warm, messages)
    want, _ = await run(HealPolicy(book), messages, cid="fresh")
    assert len(got) == len(want) == len(messages)
    for g, w, sent in zip(got, want, messages):
        assert orjson.dumps(g) in (orjson.dumps(w), orjson.dumps(sent))
    if must_match:
        assert orjson.dumps(got) == orjson.dumps(want)
    return got


async def test_a_sorting_stripping_agent_is_healed_every_turn_as_afresh():
    full = session(60, 7)
    book = await book_of(full)
    warm = HealPolicy(book)
    client = [sort_args(strip(m)) if m["role"] == "assistant" else m for m in full]
    for end in range(5, len(client) + 1, 2):  # every turn: one assistant message and its result more
        got = await check(book, warm, client[:end])
        assert [m for m in got if m["role"] == "assistant"] == [m for m in full[:end] if m["role"] == "assistant"]


async def test_reasoning_stripped_at_a_user_turn_boundary_is_healed_on_that_request():
    full = session(40, 10)
    book = await book_of(full)
    warm = HealPolicy(book)
    users = [i for i, m in enumerate(full) if m["role"] == "user"]
    for end in range(3, users[2], 2):  # two user turns sent exactly as relayed
        await check(book, warm, full[:end])
    # The third user message arrives and the client drops the reasoning of the second turn's messages.
    client = [strip(m) if users[1] < i < users[2] and m["role"] == "assistant" else m for i, m in enumerate(full)]
    got, ex = await run(warm, client[:users[2] + 1])
    assert got == full[:users[2] + 1]  # (the reasoning field comes last: key order renders alike)
    assert ex.response_headers[HEALED_HEADER].startswith(f"reasoning@{users[1] + 1},")


async def test_a_repaired_message_edited_later_goes_as_sent():
    full = session(12, 4)
    book = await book_of(full)
    warm = HealPolicy(book)
    client = [sort_args(m) if m["role"] == "assistant" else m for m in full]
    await check(book, warm, client[:15])
    # Message 2 (repaired until now) gets another start line: a history edit, not a repair to make.
    edited = copy.deepcopy(client)
    edited[2]["tool_calls"][0]["function"]["arguments"] = '{"end_line": 9, "path": "f0.py", "start_line": 1}'
    got = await check(book, warm, edited[:17])
    assert got[2] == edited[2]
    assert got[5] == full[5]  # its neighbours still repaired


@pytest.mark.parametrize("value", [True, 1.0])
async def test_arguments_sent_as_an_object_are_compared_by_type(value):
    """1, 1.0 and true are equal to Python and render differently: a message whose object arguments
    changed type is planned again, not given last time's repair."""
    full = session(6, 6)
    book = await book_of(full)
    warm = HealPolicy(book)
    client = copy.deepcopy(full)
    obj = json.loads(client[2]["tool_calls"][0]["function"]["arguments"])
    client[2]["tool_calls"][0]["function"]["arguments"] = obj
    got = await check(book, warm, client[:7])
    assert got[2]["tool_calls"][0]["function"]["arguments"] == full[2]["tool_calls"][0]["function"]["arguments"]
    client[2]["tool_calls"][0]["function"]["arguments"] = {**obj, "start_line": value}
    got = await check(book, warm, client[:9])
    assert got[2]["tool_calls"][0]["function"]["arguments"] == {**obj, "start_line": value}


async def test_messages_inserted_before_the_repaired_ones_are_found_where_they_now_are():
    full = session(10, 5)
    book = await book_of(full)
    warm = HealPolicy(book)
    client = [sort_args(m) if m["role"] == "assistant" else m for m in full]
    await check(book, warm, client[:15])
    moved = client[:1] + [{"role": "user", "content": "Context."}] + client[1:17]
    got = await check(book, warm, moved)
    assert [m for m in got if m["role"] == "assistant"] == [m for m in full[:16] if m["role"] == "assistant"]
    await check(book, warm, client[:13])  # and removed again (fewer messages than last time)


async def test_an_old_clean_message_changed_outside_the_tail_goes_as_sent():
    """The step does not read assistant messages older than the last two user turns (and the newest
    TAIL) that needed no repair last time: a change there is forwarded as sent, a repair missed."""
    full = session(30, 3)
    book = await book_of(full)
    warm = HealPolicy(book)
    await check(book, warm, full[:-6])
    client = copy.deepcopy(full)
    client[2] = strip(client[2])
    got = await check(book, warm, client[:-4], must_match=False)
    assert got[2] == client[2]
    assert TAIL >= 64


async def test_the_newest_message_unknown_to_the_book_is_looked_up_again():
    full = session(6, 6)
    book = RelayedBook(MemoryStore(), 600)
    warm = HealPolicy(book)
    client = [sort_args(m) if m["role"] == "assistant" else m for m in full]
    got, ex = await run(warm, client[:5])
    assert got == client[:5] and not ex.healed  # not relayed yet (another process's, say)
    for m in full[:5]:
        if m["role"] == "assistant":
            book.remember("default", heal_digest(m), Relayed.from_message(m))
    got, ex = await run(warm, client[:5])
    assert got[4] == full[4]  # the newest, looked up again
    assert got[2] == client[2]  # an older one unknown last time stays unknown (no lookup every request)


async def test_reasoning_kept_on_the_newest_message_only_is_healed_on_the_one_before():
    full = session(20, 20)
    book = await book_of(full)
    warm = HealPolicy(book)
    for end in range(5, len(full) + 1, 2):
        client = [strip(m) if m["role"] == "assistant" and i < end - 2 else m for i, m in enumerate(full[:end])]
        for _ in range(1 + end % 3):  # some sent twice (a retry)
            got = await check(book, warm, client)
            assert got == full[:end]


async def test_requests_that_add_no_assistant_message_keep_the_memory():
    """A user message alone, or the same request again (a retry), between turns."""
    full = session(12, 3)
    book = await book_of(full)
    warm = HealPolicy(book)
    client = [sort_args(m) if m["role"] == "assistant" else m for m in full]
    for end in (7, 8, 8, 9, 11, 12, 12, 15, 16, 17, 17, len(client)):
        await check(book, warm, client[:end])
    mem = warm._memory["c1"]
    assert mem.n == len(client)


async def test_nothing_to_repair_does_not_read_the_history():
    """CPU of the step per turn on a 1,200-message session: sent back as relayed, it reads the new
    messages only; with every message repaired it reads them all. Medians of 40 turns each; measured
    0.15-0.19x (a history walk or a serialisation of every message would make it ~1x)."""
    import statistics
    import time

    full = session(600, 25)
    book = await book_of(full)

    async def cpu(client: list[dict]) -> float:
        warm = HealPolicy(book)
        times = []
        for end in range(len(client) - 82, len(client) + 1, 2):
            raw = orjson.dumps({"model": "m", "messages": client[:end], "tools": TOOLS})
            body = orjson.loads(raw)
            ex = exchange(body)
            t0 = time.thread_time()
            await warm.apply(ex, LANE, body)
            times.append(time.thread_time() - t0)
        return statistics.median(times[1:])

    clean = await cpu(full)
    repaired = await cpu([sort_args(strip(m)) if m["role"] == "assistant" else m for m in full])
    print(f"clean {clean * 1e3:.3f} ms, repaired {repaired * 1e3:.3f} ms: {clean / repaired:.2f}x")
    assert clean < 0.5 * repaired, (clean, repaired)


async def test_a_history_handed_over_as_last_turns_objects_is_healed_as_afresh():
    """The pipeline's history memo gives a long body's unchanged history as the very message objects it
    parsed last turn (and the new messages parsed): the step knows them by identity, and changes none."""
    full = session(40, 8)
    book = await book_of(full)
    warm = HealPolicy(book)
    client = [sort_args(strip(m)) if m["role"] == "assistant" else m for m in full]
    history: list[dict] = []
    for end in range(5, len(client) + 1, 2):
        history = history + orjson.loads(orjson.dumps(client[len(history):end]))
        before = orjson.dumps(history)
        body = {"model": "m", "messages": list(history), "tools": TOOLS}
        ex = exchange(body)
        await warm.apply(ex, LANE, body)
        assert orjson.dumps(history) == before  # the shared objects are never changed
        want, _ = await run(HealPolicy(book), client[:end], cid="fresh")
        assert orjson.dumps(body["messages"]) == orjson.dumps(want)
