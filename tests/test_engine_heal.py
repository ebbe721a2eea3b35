"""Drift healing against the real engine's prefix cache (vLLM CPU, shared/engine).

An agent that re-serialises its history on every send, sorting every call's argument keys and dropping
every reasoning text (as many clients do), talks to two lanes on the same engine: one with healing, one
without. With healing every turn after the first is a hit whose cached tokens, as the engine reports
them, equal the gateway's prediction; without it every turn drifts at the first assistant message
(`client_stripped_reasoning`), the engine agreeing token for token.

The engine's random-weight model answers with reasoning only (see test_engine_cache.py), so the
arguments it sorts are those of the client's own tool call; it sorts them from its first request on, so
that part never drifts, and the repair of relayed arguments is exercised in tests/test_heal_e2e.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.support.engine_proc import EngineProc, engine_lane
from tests.support.gateway_proc import run_gateway
from tests.support.conversations import wait_record
from tests.support.engine_agent import Agent, assert_first_turn, report

pytestmark = pytest.mark.engine

KINDS = ["arguments", "reasoning", "content", "tool_result_order", "reasoning_field"]



@pytest.fixture(scope="module")
def gw(engine: EngineProc):
    routes = {"lanes": {"heal": engine_lane(engine.url, heal=KINDS), "plain": engine_lane(engine.url)},
              "models": {"ds-heal": "heal", "ds": "plain"}}
    with run_gateway(routes) as g:
        yield g


def reserialise(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the client sends: its history with sorted argument keys and no reasoning."""
    out = copy.deepcopy(messages)
    for m in out:
        m.pop("reasoning_content", None)
        m.pop("reasoning", None)
        for call in m.get("tool_calls") or ():
            call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), sort_keys=True)
    return out


class ReserialisingAgent(Agent):
    """The engine agent (tests/support/engine_agent.py), sending its history re-serialised (it keeps the
    original itself)."""

    def turn(self, next_user: str | None = None, **kw: Any) -> dict[str, Any]:
        history = self.messages
        self.messages = reserialise(history)
        sent = len(self.messages)
        try:
            return super().turn(next_user, **kw)
        finally:
            self.messages = history + self.messages[sent:]


def test_sorted_arguments_and_stripped_reasoning_hit_with_healing_and_drift_without(gw):
    healed = ReserialisingAgent(gw, "heal-on", model="ds-heal")
    first = healed.turn()
    assert_first_turn(first)
    for _ in range(4):
        healed.turn()
    plain = ReserialisingAgent(gw, "heal-off", model="ds")
    plain.turn()
    for _ in range(2):
        plain.turn()
    report("heal_on", healed.rows)
    report("heal_off", plain.rows)
    for row in healed.rows[1:]:
        assert row["verdict"] == "hit", row
        assert row["predicted"] == row["reported"] > 0, row
        record = wait_record(gw, healed.cid, row["turn"])
        assert json.loads(record["healed"])["reasoning"] == row["turn"] - 1, record
        assert record["healed_tokens"] > 0, record
    for row in plain.rows[1:]:
        assert row["verdict"] == "drift" and row["cause"] == "client_stripped_reasoning", row
        assert row["predicted"] == row["reported"], row
    # The first drift re-prefills from the first relayed message on; later ones lose only what the
    # newest stripped message shifts, often less than a block.
    assert plain.rows[1]["tokens_lost"] > 0, plain.rows[1]
    assert healed.rows[1]["predicted"] > plain.rows[1]["predicted"]


def test_two_edits_in_one_message_are_named_by_the_first_differing_part(gw):
    """An earlier assistant message sent back with its reasoning stripped and its call's argument keys
    re-sorted: the render differs first at the reasoning, so the cause is client_stripped_reasoning
    (not the tool calls), and the engine reports the prefix the gateway predicted."""
    agent = Agent(gw, "combined-edit", model="ds")
    call = agent.messages[2]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps({"path": "src/split.py", "mode": "read"})
    agent.turn()
    edited = copy.deepcopy(agent.messages[2])
    edited.pop("reasoning_content")
    edited["tool_calls"][0]["function"]["arguments"] = json.dumps({"mode": "read", "path": "src/split.py"})
    agent.messages[2] = edited
    row = agent.turn()
    report("combined_edit", agent.rows)
    assert row["verdict"] == "drift" and row["cause"] == "client_stripped_reasoning", row
    assert row["divergence_message_index"] == 2, row
    assert row["predicted"] == row["reported"], row
