"""Drift healing end to end: the emulator's real prefix cache (the DeepSeek renderer and
tokenizer) behind the real gateway, driven by clients that edit their history the way real ones do.

Every kind is shown to turn the client's drift into a hit the engine confirms (predicted == reported),
announced, recorded with the tokens it saved and counted; every refusal is shown to leave the request
as sent, with the drift named as without healing.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from typing import Any, Callable

import httpx
import openai
import pytest

from tests.support.conversations import wait_analysed, wait_record
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, routes
from tests.support.streamed_turn import add_tool_call_deltas, append_turn

ALL_KINDS = ["arguments", "reasoning", "content", "tool_result_order", "reasoning_field"]
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read part of a file.",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
        "required": ["path", "start_line", "end_line"]}}}]
Drift = Callable[[list[dict[str, Any]]], None]
_TAGS = itertools.count()  # each client's own system prompt: no two clients share cached blocks


def heal_lane(url: str, engine: str = "vllm", **extra: Any) -> dict:
    """A lane on the template's own effort map, predicting in the engine's blocks (SGLang's are 1 token)."""
    return lane(url, **{"engine": engine, "cache": {"block_size": 1 if engine == "sglang" else 16},
                        "render": {"template": "deepseek_v4.1"}, **extra})


def heal_routes(url: str, engine: str = "vllm", **extra: Any) -> dict:
    """Lane "ds" heals every kind, lane "plain" none; both on the same engine."""
    return routes({"ds": heal_lane(url, engine, heal=ALL_KINDS, **extra), "plain": heal_lane(url, engine, **extra)})


class Client:
    """An agent whose history keeps what the gateway relayed, and which edits it on every send (`drift`)."""

    def __init__(self, gw, *, model: str = "ds", tools: bool = True, drift: Drift | None = None,
                 opening: list[dict] | None = None, field: str = "reasoning_content", **kw: Any) -> None:
        self.gw = gw
        self.client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
        self.model = model
        self.tools = TOOLS if tools else None
        self.drift = drift
        self.field = field  # where the client keeps reasoning in its history
        self.kw = kw
        self.messages: list[dict[str, Any]] = [
            {"role": "system",
             "content": f"[{next(_TAGS)}] You are a coding agent. Read files before you change them."},
            *(opening or []),
            {"role": "user", "content": "Find why test_split fails and fix it."}]
        self.cid: str | None = None
        self.turns = 0

    def sent(self) -> list[dict[str, Any]]:
        out = copy.deepcopy(self.messages)
        if self.drift is not None:
            self.drift(out)
        return out

    def turn(self, headers: dict | None = None) -> tuple[dict, dict]:
        args: dict[str, Any] = {"model": self.model, "messages": self.sent(), "max_tokens": 20, **self.kw}
        if self.tools:
            args["tools"] = self.tools
        raw = self.client.chat.completions.with_raw_response.create(stream=True, extra_headers=headers, **args)
        reasoning, content, calls = "", "", {}
        for chunk in raw.parse():
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            extra = d.model_extra or {}
            reasoning += extra.get("reasoning") or extra.get("reasoning_content") or ""
            content += d.content or ""
            add_tool_call_deltas(calls, d.tool_calls)
        append_turn(self.messages, content, reasoning, self.field, calls, f"lines of {self.turns}.py",
                    f"Continue with step {self.turns}.")
        out_headers = dict(raw.headers)
        self.cid = out_headers["x-gateway-conversation"].split(";")[0]
        self.turns += 1
        turn = int(out_headers["x-gateway-conversation"].split("turn=")[1].split(";")[0])
        return out_headers, wait_analysed(self.gw, self.cid, turn)["last_cache"]


# -- the drifts of real clients --------------------------------------------------------------------

def sort_arguments(messages: list[dict]) -> None:
    for m in messages:
        for c in m.get("tool_calls") or ():
            c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), sort_keys=True,
                                                    separators=(",", ":"))


def strip_reasoning(messages: list[dict]) -> None:
    for m in messages:
        m.pop("reasoning", None)
        m.pop("reasoning_content", None)


def pad_content(messages: list[dict]) -> None:
    for m in messages:
        if m["role"] == "assistant" and m.get("content"):
            m["content"] = "\n" + m["content"] + "  \n"


def rename_reasoning(messages: list[dict]) -> None:
    for m in messages:
        if "reasoning_content" in m:
            m["reasoning"] = m.pop("reasoning_content")


def both(*drifts: Drift) -> Drift:
    def run(messages: list[dict]) -> None:
        for d in drifts:
            d(messages)
    return run


def healed_kinds(headers: dict) -> list[str]:
    value = headers.get("x-gateway-healed", "")
    return sorted({item.split("@")[0] for item in value.split(",") if "@" in item})


def assert_hit(cache: dict) -> None:
    assert cache["verdict"] == "hit", cache
    assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, cache


def records_of(gw, cid: str, turn: int) -> dict:
    return wait_record(gw, cid, turn, timeout=30)


# -- every kind -------------------------------------------------------------------------------------

def test_sorted_arguments_and_stripped_reasoning_are_healed_into_hits(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, drift=both(sort_arguments, strip_reasoning))
        agent.turn()
        for turn in range(2, 6):
            headers, cache = agent.turn()
            assert_hit(cache)
            assert healed_kinds(headers) == ["arguments", "reasoning"]
            # Every assistant message the client drifted, each turn (the client repeats its edits).
            assert len(headers["x-gateway-healed"].split(",")) == 2 * (turn - 1)
            assert cache["healed_tokens"]["arguments"] > 0
        row = records_of(gw, agent.cid, agent.turns)
        assert json.loads(row["healed"]) == {"arguments": 4, "reasoning": 4} and row["healed_tokens"] > 0
        metrics = httpx.get(gw.url + "/metrics").text
        assert re.search(r'gateway_healed_tokens_total\{kind="arguments",lane="ds"\} [1-9]', metrics)
        # Both kinds repaired the same messages: their tokens count once, under the first kind.
        assert re.search(r'gateway_heals_total\{kind="reasoning",lane="ds"\} 10\.0', metrics)


def test_long_bodies_read_through_the_history_memo_are_healed_too(agent_emu):
    """Past 64 KB the pipeline reuses the previous turn's parsed history and forwards the client's own
    bytes while the body holds the list it parsed: the repairs go in a new list, so they are forwarded."""
    notes = " ".join(f"note {i}: the parser keeps the column of every token it reads." for i in range(1300))
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, drift=both(sort_arguments, strip_reasoning),
                       opening=[{"role": "user", "content": f"Project notes: {notes}"}])
        agent.turn()
        for turn in range(2, 5):
            headers, cache = agent.turn()
            assert cache["verdict"] == "hit", cache
            assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"], cache
            assert healed_kinds(headers) == ["arguments", "reasoning"]
            assert len(headers["x-gateway-healed"].split(",")) == 2 * (turn - 1)


def test_the_same_client_without_healing_drifts_as_documented(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, model="plain", drift=sort_arguments)
        agent.turn()
        headers, cache = agent.turn()
        assert "x-gateway-healed" not in headers
        assert cache["verdict"] == "drift" and cache["divergence_message_index"] == 2, cache
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]
        agent = Client(gw, model="plain", drift=strip_reasoning)
        agent.turn()
        _, cache = agent.turn()
        assert cache["verdict"] == "drift" and cache["cause"] == "client_stripped_reasoning", cache


def test_opt_out_header_sends_the_request_as_is(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, drift=sort_arguments)
        agent.turn()
        headers, cache = agent.turn(headers={"X-Gateway-Heal": "off"})
        assert "x-gateway-healed" not in headers
        assert cache["verdict"] == "drift", cache


def test_padded_content_is_healed(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        # The content edit changes the lineage digest; the client's own key finds the conversation.
        agent = Client(gw, drift=pad_content, user="content-agent")
        agent.turn()
        for _ in range(3):
            headers, cache = agent.turn()
            assert_hit(cache)
            assert healed_kinds(headers) == ["content"]


def test_tool_results_reordered_without_ids_are_put_back(agent_emu):
    opening = [
        {"role": "user", "content": "Read both files."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b.py"}'}}]},
        {"role": "tool", "content": "contents of a.py"},
        {"role": "tool", "content": "contents of b.py"},
    ]

    def reorder(messages: list[dict]) -> None:
        messages[3], messages[4] = messages[4], messages[3]

    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, opening=opening)
        agent.turn()
        agent.drift = reorder
        headers, cache = agent.turn()
        assert_hit(cache)
        assert headers["x-gateway-healed"] == "tool_result_order@3"
        # Without healing the same reorder is a drift at the results.
        plain = Client(gw, model="plain", opening=opening)
        plain.turn()
        plain.drift = reorder
        headers, cache = plain.turn()
        assert "x-gateway-healed" not in headers and cache["verdict"] == "drift", cache


def test_renamed_reasoning_field_is_put_back_on_sglang():
    with run_emulator(flavour="sglang", tokenizer="dsv41", default_thinking=True) as emu, \
            run_gateway(heal_routes(emu.url, engine="sglang")) as gw:
        agent = Client(gw, field="reasoning_content", drift=rename_reasoning)
        agent.turn()
        headers, cache = agent.turn()
        # The sglang emulator reports one token more than predicted on every hit, healed or not
        # (an unhealed append-only agent too): a prediction matter outside healing.
        assert (cache["verdict"] == "hit"
                and 0 <= cache["reported_cached_tokens"] - cache["predicted_cached_tokens"] <= 1)
        assert healed_kinds(headers) == ["reasoning_field"]
        plain = Client(gw, model="plain", field="reasoning_content", drift=rename_reasoning)
        plain.turn()
        _, cache = plain.turn()
        assert cache["verdict"] == "drift", cache


# -- every refusal ------------------------------------------------------------------------------------

def change_arguments(messages: list[dict]) -> None:
    for m in messages:
        for c in m.get("tool_calls") or ():
            args = json.loads(c["function"]["arguments"])
            args["start_line"] = args.get("start_line", 0) + 1
            c["function"]["arguments"] = json.dumps(dict(sorted(args.items())))


def edit_reasoning(messages: list[dict]) -> None:
    for m in messages:
        if m.get("reasoning_content"):
            m["reasoning_content"] = m["reasoning_content"][: len(m["reasoning_content"]) // 2]


def edit_content(messages: list[dict]) -> None:
    for m in messages:
        if m["role"] == "assistant" and m.get("content"):
            m["content"] = m["content"] + " (edited)"


def other_call_id(messages: list[dict]) -> None:
    sort_arguments(messages)
    for m in messages:
        for c in m.get("tool_calls") or ():
            c["id"] = "call_renamed_by_client"


@pytest.mark.parametrize("drift", [change_arguments, edit_reasoning, other_call_id],
                         ids=["arguments_changed", "reasoning_edited", "call_id_changed"])
def test_edits_that_change_meaning_are_not_healed(agent_emu, drift):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        # The client's key keeps the conversation whatever the edit does to its lineage.
        agent = Client(gw, drift=drift, user=drift.__name__)
        agent.turn()
        headers, cache = agent.turn()
        assert "x-gateway-healed" not in headers
        assert cache["verdict"] == "drift", cache
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"]


def test_edited_content_is_not_healed(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, drift=edit_content, user="edited-content")
        agent.turn()
        headers, cache = agent.turn()
        assert "x-gateway-healed" not in headers and cache["verdict"] == "drift", cache


def test_ambiguous_tool_results_are_left_in_the_clients_order(agent_emu):
    opening = [
        {"role": "user", "content": "Read both files."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b.py"}'}}]},
        {"role": "tool", "content": "same text"},
        {"role": "tool", "content": "same text", "name": "read_file"},
    ]

    def reorder(messages: list[dict]) -> None:
        messages[3], messages[4] = messages[4], messages[3]

    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, opening=opening)
        agent.turn()
        agent.drift = reorder
        headers, _ = agent.turn()
        assert "x-gateway-healed" not in headers


def test_reasoning_the_template_drops_is_left_alone(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        # No tools, drop_thinking on: the template drops earlier reasoning whatever the client sends.
        agent = Client(gw, tools=False, drift=strip_reasoning)
        agent.turn()
        headers, cache = agent.turn()
        assert "x-gateway-healed" not in headers
        # As without healing: the template itself re-renders the previous turn without its reasoning.
        assert cache["verdict"] == "drift" and cache["cause"] == "reasoning_dropped_by_template", cache


def test_a_new_conversation_is_not_healed(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, drift=sort_arguments)
        agent.turn()
        # The same history under a key the gateway has never seen: no state at hand.
        headers, cache = agent.turn(headers={"X-Conversation-Id": "never-seen"})
        assert "x-gateway-healed" not in headers
        # Nothing of its own to compare with: what the replica holds of the first session is predicted.
        assert cache["verdict"] in ("cold", "hit") and cache["cause"] in (None, "shared_prefix"), cache
        assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"], cache


def test_reasoning_echoed_as_vllm_streams_it_is_moved_to_the_field_the_template_reads(agent_emu):
    with run_gateway(heal_routes(agent_emu.url)) as gw:
        agent = Client(gw, field="reasoning")  # what vLLM streamed, echoed back as is
        agent.turn()
        headers, cache = agent.turn()
        assert healed_kinds(headers) == ["reasoning_field"]
        assert_hit(cache)
        agent = Client(gw, field="reasoning_content")  # already where the template reads it
        agent.turn()
        headers, cache = agent.turn()
        assert "x-gateway-healed" not in headers
        assert_hit(cache)
