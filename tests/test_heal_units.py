"""Drift healing's pure parts: what each kind accepts and refuses, the tokens saved, the header, config."""

from __future__ import annotations

import json

import pytest

from gateway.core.config import ConfigError, parse_routes
from gateway.core.exchange import Healed
from gateway.server.headers import safe_value
from gateway.heal.arguments import Arguments
from gateway.heal.base import POP, Relayed, canonical_args, heal_digest, norm_text
from gateway.heal.content import Content
from gateway.heal.policy import header_value, plan
from gateway.heal.reasoning import Reasoning, keeps_reasoning
from gateway.heal.reasoning_field import ReasoningField
from gateway.heal.saved import tokens_saved
from gateway.heal.tool_result_order import ToolResultOrder, id_less_groups
from tests.support.poll import until

ARGS = '{"path": "a.py", "start_line": 1, "end_line": 9}'
RELAYED = Relayed("Reading it.", "I should read a.py first.", (("call_1", "read_file", ARGS),))


def msg(**kw) -> dict:
    base = {"role": "assistant", "content": "Reading it.", "reasoning_content": "I should read a.py first.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": ARGS}}]}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def calls(args, cid="call_1", name="read_file") -> list:
    return [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]


@pytest.mark.parametrize("args", [
    json.dumps(json.loads(ARGS), sort_keys=True),
    json.dumps(json.loads(ARGS), indent=2),
    '{"path":"a.py","start_line":1,"end_line":9}',
    '{"path": "\\u0061.py", "start_line": 1, "end_line": 9}',
    json.loads(ARGS),  # an object instead of a string
])
def test_arguments_same_value_other_bytes_get_the_relayed_string(args):
    updates = Arguments().plan(msg(tool_calls=calls(args)), RELAYED)
    assert updates is not None and updates["tool_calls"][0]["function"]["arguments"] == ARGS
    assert updates["tool_calls"][0]["id"] == "call_1"


@pytest.mark.parametrize("tool_calls", [
    calls('{"path": "a.py", "start_line": 2, "end_line": 9}'),  # another value
    calls('{"path": "a.py", "start_line": 1.0, "end_line": 9}'),  # another type: renders "1.0"
    calls('{"path": "a.py", "start_line": true, "end_line": 9}'),
    calls(json.dumps(json.loads(ARGS), sort_keys=True), cid="call_other"),  # another call's id
    calls(json.dumps(json.loads(ARGS), sort_keys=True), name="write_file"),
    calls(ARGS) * 2,  # another number of calls
    calls("{not json"),
])
def test_arguments_refuses_another_meaning(tool_calls):
    assert Arguments().plan(msg(tool_calls=tool_calls), RELAYED) is None


def test_arguments_without_client_ids_match_by_place():
    updates = Arguments().plan(msg(tool_calls=calls(json.dumps(json.loads(ARGS), sort_keys=True), cid=None)), RELAYED)
    assert updates is not None and updates["tool_calls"][0]["function"]["arguments"] == ARGS, updates  # the relayed


def test_arguments_as_relayed_need_nothing():
    assert Arguments().plan(msg(), RELAYED) is None


def test_reasoning_put_back_only_when_absent():
    updates = Reasoning().plan(msg(reasoning_content=None), RELAYED)
    assert updates == {"reasoning_content": RELAYED.reasoning}
    updates = Reasoning().plan(msg(reasoning_content=None, reasoning=""), RELAYED)
    assert updates == {"reasoning_content": RELAYED.reasoning, "reasoning": POP}
    assert Reasoning().plan(msg(reasoning_content="I should read"), RELAYED) is None  # edited: not ours
    assert Reasoning().plan(msg(), RELAYED) is None


def test_reasoning_kept_by_the_template_only_with_tools_or_drop_thinking_off():
    assert keeps_reasoning("deepseek_v4.1", True, True, {"tools": [{}]})
    assert not keeps_reasoning("deepseek_v4.1", True, True, {})
    assert keeps_reasoning("deepseek_v4.1", True, False, {})
    assert keeps_reasoning("deepseek_v4.1", True, True, {"chat_template_kwargs": {"drop_thinking": False}})
    assert not keeps_reasoning("deepseek_v4.1", True, False, {"chat_template_kwargs": {"drop_thinking": True}})
    assert not keeps_reasoning("deepseek_v4.1", False, False, {"tools": [{}]})  # chat mode renders none
    assert not keeps_reasoning(None, True, False, {"tools": [{}]})  # unknown template: do not guess


def test_reasoning_field_moves_exact_text_only():
    m = msg(reasoning_content=None, reasoning=RELAYED.reasoning)
    assert ReasoningField().plan(m, RELAYED) == {"reasoning_content": RELAYED.reasoning, "reasoning": POP}
    assert ReasoningField().plan(msg(reasoning_content=None, reasoning="other"), RELAYED) is None
    assert ReasoningField().plan(msg(), RELAYED) is None


@pytest.mark.parametrize("text", ["  Reading it.\n", "Reading it. ", "Reading\\u0020it."])
def test_content_same_text_after_normalisation(text):
    assert Content().plan(msg(content=text), RELAYED) == {"content": "Reading it."}


@pytest.mark.parametrize("text", ["Reading it!", "reading it.", "Reading  it."])
def test_content_refuses_other_text(text):
    assert Content().plan(msg(content=text), RELAYED) is None


def test_norm_text_and_canonical_args():
    assert norm_text("  e\u0301 \\u00e9\n") == "\u00e9 \u00e9"
    assert norm_text("\\ud83d\\ude00") == "\U0001f600"
    assert norm_text("\\ud83d alone") == "\\ud83d alone"  # a lone surrogate escape stays as written
    assert canonical_args('{"b": 1, "a": 2}') == canonical_args('{ "a":2,"b":1 }')
    assert canonical_args('{"a": 1}') != canonical_args('{"a": 1.0}')
    assert canonical_args("{oops") is None


def test_drifted_copies_find_the_relayed_message():
    relayed = msg(content="Reading it.\n")
    for drifted in (msg(content="Reading it.", reasoning_content=None),
                    msg(content="Reading it.\n", tool_calls=calls(json.dumps(json.loads(ARGS), sort_keys=True)))):
        assert heal_digest(drifted) == heal_digest(relayed)
    assert heal_digest(msg(content="Other.")) != heal_digest(relayed)


def test_plan_combines_kinds():
    m = msg(reasoning_content=None, content=" Reading it.",
            tool_calls=calls(json.dumps(json.loads(ARGS), sort_keys=True)))
    assert [kind for kind, _ in plan(m, RELAYED)] == ["arguments", "content", "reasoning"]


def test_tool_results_put_back_in_forwarded_order():
    assistant = {"role": "assistant", "content": "", "tool_calls": calls("{}", "a") + calls("{}", "b")}
    first = [assistant, {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}]
    groups = id_less_groups(first, [0])
    assert groups == [(0, 1, 3)]
    forwarded: dict = {}
    order = ToolResultOrder()
    assert not order.heal(first, groups[0], forwarded)  # first sight: remembered
    swapped = [assistant, {"role": "tool", "content": "B"}, {"role": "tool", "content": "A"}]
    assert order.heal(swapped, groups[0], forwarded)
    assert [m["content"] for m in swapped[1:]] == ["A", "B"]
    # Duplicates, another set, or ids: left alone.
    dup = [assistant, {"role": "tool", "content": "A"}, {"role": "tool", "content": "A"}]
    assert not order.heal(dup, groups[0], dict(forwarded))
    other = [assistant, {"role": "tool", "content": "C"}, {"role": "tool", "content": "A"}]
    assert not order.heal(other, groups[0], dict(forwarded))
    with_ids = [assistant, {"role": "tool", "tool_call_id": "b", "content": "B"}, {"role": "tool", "content": "A"}]
    assert id_less_groups(with_ids, [0]) == []


def test_tokens_saved_split_between_repairs_within_the_kept_prefix():
    segments = [(0, 100), (1, 20), (2, 50), (3, 30), (4, 40)]  # message starts: 0, 100, 120, 170, 200
    saved = tokens_saved(segments, 230, [("reasoning", 2), ("arguments", 2), ("content", 4)])
    assert saved == {"reasoning": 80, "arguments": 0, "content": 30}
    assert tokens_saved(segments, 110, [("reasoning", 2)]) == {"reasoning": 0}  # broke before it


def test_header_value_is_safe_and_bounded():
    healed = [Healed("arguments", [2, 4]), Healed("reasoning", [2])]
    assert header_value(healed) == "arguments@2,reasoning@2,arguments@4"
    many = [Healed("reasoning", list(range(0, 3000, 2)))]
    value = header_value(many)
    assert len(value) < 450 and value.endswith(f"+{1500 - value.count('@')}")
    assert safe_value("X-Gateway-Healed", value) == value


def test_config_kinds_are_checked():
    base = "lanes:\n  a:\n    replicas: [http://127.0.0.1:1]\n    upstream_model: m\n    heal: {}\nmodels: {{m: a}}\n"
    assert parse_routes(base.format("[arguments, reasoning]")).lanes["a"].heal == ["arguments", "reasoning"]
    assert parse_routes(base.format("[]")).lanes["a"].heal == []
    with pytest.raises(ConfigError, match=r"lanes\.a\.heal\.0"):
        parse_routes(base.format("[argument]"))
    with pytest.raises(ConfigError, match="listed twice"):
        parse_routes(base.format("[content, content]"))


async def test_turn_end_keeps_the_relayed_message_and_anchors_its_trimmed_content():
    from types import SimpleNamespace

    from tests.support.routes import lane_config
    from gateway.conversations.identity import anchor_keys, message_digest
    from gateway.conversations.state import ConversationState
    from gateway.core.exchange import Exchange
    from gateway.heal.book import RelayedBook
    from gateway.heal.turn_end import HealTurnEnd
    from gateway.store.memory import MemoryStore

    store = MemoryStore()
    book = RelayedBook(store, 60)
    end = HealTurnEnd(book, store, 60)
    lane = SimpleNamespace(name="ds", config=lane_config(heal=["content"]))
    ex = Exchange("r1", status=200, tenant="acme", body={"messages": [{"role": "user", "content": "hi"}]})
    ex.conversation = SimpleNamespace(state=ConversationState("c1", "lineage", turn=2), is_new=False)
    ex.generated.content.append("Done.  \n")
    ex.generated.reasoning.append("Think.")
    end.exchange_ended(ex, lane)
    relayed = {"role": "assistant", "content": "Done.  \n"}
    trimmed = anchor_keys(message_digest({"role": "assistant", "content": "Done."}), 1, "acme")

    async def written() -> bool:  # the turn end writes in the background
        return await store.get(f"rel:acme:{heal_digest(relayed):016x}") is not None and \
            await store.mget(trimmed) == [b"c1|3", b"c1|3"]

    await until(written, what="the relayed answer and its anchors written")
    found = await book.lookup("acme", [heal_digest(relayed)])
    assert found[heal_digest(relayed)] == Relayed("Done.  \n", "Think.", ())
    assert await book.lookup("other-tenant", [heal_digest(relayed)]) == {}  # never across tenants
    assert await store.get(f"rel:acme:{heal_digest(relayed):016x}") is not None
    assert await store.mget(trimmed) == [b"c1|3", b"c1|3"]


@pytest.mark.parametrize("m", [
    msg(),
    msg(tool_calls=None),
    msg(tool_calls=[]),
    msg(content="", tool_calls=calls('{"b": [1, 2.5, {"z": null, "a": "\\u00e9\\ud83d\\ude00"}], "a": true}')),
    msg(content="caf\u00e9 \U0001f600", tool_calls=calls('{"x": 1}') + calls('{}', cid="call_2", name="other")),
    msg(tool_calls=calls('{"n": 12345678901234567890123}')),  # too big for orjson: the general way
    msg(tool_calls=calls('[1, 2]')),
    msg(tool_calls=calls('{not json')),
    msg(tool_calls=calls({"a": 1})),
])
def test_the_plain_digest_is_the_lineage_digest(m):
    from gateway.conversations.identity import message_digest
    from gateway.heal.base import _plain_digest

    fast = _plain_digest(m, m["content"])
    assert fast is None or fast == message_digest(m)
    assert heal_digest(m) == message_digest(m)
    if (isinstance(m.get("tool_calls"), list)
            and all(isinstance(c["function"]["arguments"], str) for c in m["tool_calls"])):
        if all(a.startswith("{") and "not" not in a and "123456789012" not in a
               for a in (c["function"]["arguments"] for c in m["tool_calls"])):
            assert fast is not None  # the common shape takes the short way
