"""The gateway's cache predictions against a real engine's prefix cache (vLLM CPU, shared/engine).

The real gateway runs in front of the session's engine (tests/support/engine_proc.py: the gateway's
own template, DeepSeek-V4.1 tool and reasoning parsers, 32-token blocks, a 128-block KV pool) and is
driven with the official `openai` client like an agent. For every turn the gateway predicts how many
prompt tokens the engine should find cached and the engine reports how many it did
(`usage.prompt_tokens_details.cached_tokens`); the tests require them to be equal, token for token,
wherever the prefix was stable, and the right verdict (hit, drift and its cause, eviction) otherwise.

Determinism: temperature 0, `ignore_eos`, a fixed max_tokens, and `logit_bias` that confines the
random-weight model to a few whole words. Unbiased, this model emits `<think>` special tokens between
words; the text the client gets back (and appends to its history) then re-renders to other tokens than
the engine generated, which no gateway can see. The bias makes the model behave like a trained one in
the only way that matters here: the history the client appends re-renders to the tokens generated.
The model never emits DSML tool calls or `</think>`, so each assistant turn comes back as reasoning
only; the agent appends exactly what the engine returned (reasoning, empty content) plus the next user
message, and the tool-call part of the history is the client's own (a tool call with a text-parts
result in the opening request), which is rendered on every turn.

Per-turn figures (predicted vs reported, verdicts, timings) are printed (`pytest -s`) and written to
tests/artifacts/engine-cache.json.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.pipeline import token_ids
from tests.support.conversations import wait_record
from tests.support.engine_agent import REPORT, TOOLS, Agent, assert_exact, assert_first_turn, filler, report
from tests.support.engine_proc import MODEL, REPO, EngineProc, engine_lane
from tests.support.gateway_proc import run_gateway

pytestmark = pytest.mark.engine

ARTIFACT = REPO / "tests" / "artifacts" / "engine-cache.json"



@pytest.fixture(scope="module")
def gw(engine: EngineProc):
    routes = {
        "lanes": {
            "vllm-cpu": engine_lane(engine.url),  # effort_policy: pin
            "vllm-cpu-warn": engine_lane(engine.url, effort_policy="warn"),
            # A lane whose settings differ from the template's defaults: the engine must be told them.
            "vllm-cpu-told": engine_lane(engine.url, render={"effort_map": {"low": 20, "high": 75, "max": 100},
                                                             "drop_thinking": False}),
        },
        "models": {"ds": "vllm-cpu", "ds-warn": "vllm-cpu-warn", "ds-told": "vllm-cpu-told"},
    }
    with run_gateway(routes) as g:
        yield g
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps({"engine": engine.url, "engine_start_s": round(engine.started_s, 1),
                                    **REPORT}, indent=1))


# -- 1. append-only agent with tools ---------------------------------------------------------------


def test_agent_sending_back_vllms_reasoning_field_hits_every_turn(gw):
    # vLLM streams reasoning as `reasoning`; an agent that appends the message exactly as it received
    # it must be a hit every turn, predicted = reported (the gateway once rendered it without reasoning).
    agent = Agent(gw, "agent-reasoning-field", reasoning_field="reasoning")
    agent.turn()
    for _ in range(5):
        agent.turn()
    report("agent_sending_back_reasoning_field", agent.rows)
    assert any("reasoning" in m for m in agent.messages if m["role"] == "assistant")
    for row in agent.rows[1:]:
        assert row["verdict"] == "hit", row
        assert_exact(row)


def test_a_lane_with_non_default_effort_map_and_drop_thinking_off_is_told_to_the_engine(gw):
    # effort_map high=75 (the template's own table says 50) and drop_thinking false (the template's
    # default is true): the engine's prompt token ids must equal the gateway's render on every turn.
    from gateway.core.config import Lane
    from gateway.render.cli import render_request
    from gateway.render.options import options_for_lane

    lane = Lane.model_validate(engine_lane("http://127.0.0.1:9", render={
        "effort_map": {"low": 20, "high": 75, "max": 100}, "drop_thinking": False}))
    # Explicit keys: the agent's outputs are reasoning only, which lineage ignores, so the probes'
    # outputs would look like the agent's to it.
    agent = Agent(gw, "told-lane", model="ds-told", tools=False, reasoning_effort="high", user="told-agent")
    for turn in range(4):
        sent = [dict(m) for m in agent.messages]
        agent.turn()
        # The same request again, as its own conversation (so the agent's verdicts stay its own), asking
        # vLLM for the ids it prefilled; its prompt is already cached by the agent's turn.
        body = {"model": "ds-told", "messages": sent, "reasoning_effort": "high", "max_tokens": 1,
                "temperature": 0, "return_token_ids": True}
        out = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=120,
                         headers={"X-Conversation-Id": f"told-probe-{turn}"}).json()
        ours = render_request(body, options_for_lane(lane), lane=lane)
        assert out["prompt_token_ids"] == ours.token_ids, (turn, len(out["prompt_token_ids"]), ours.n_tokens)
        assert "Reasoning Effort: 75 " in ours.prompt
        if turn:
            assert "</think>" in ours.prompt  # earlier reasoning kept: the engine did not drop it
    report("told_lane", agent.rows)
    for row in agent.rows[1:]:
        assert row["verdict"] == "hit", row
        assert_exact(row)


def test_append_only_agent_with_tools_hits_every_turn_exactly(gw):
    agent = Agent(gw, "agent-append")
    first = agent.turn()
    assert_first_turn(first)
    assert first["output"].strip(), "the engine returned no text"
    for _ in range(8):
        agent.turn()
    report("append_only_agent_with_tools", agent.rows)
    for row in agent.rows[1:]:
        assert row["verdict"] == "hit", row
        assert row["predicted"] > 0
        assert_exact(row)
    # The conversation grew: the last turn found more of it cached than the second did.
    assert agent.rows[-1]["reported"] > agent.rows[1]["reported"]


def test_output_cut_at_a_block_boundary_is_predicted_exactly(gw, engine):
    """The output stops at max_tokens exactly where prompt + output fills whole blocks: the engine holds
    KV for prompt + completion - 1 tokens (one block less than the next render's common prefix)."""
    agent = Agent(gw, "agent-boundary")
    # Find the prompt length the engine will see (its own render), then cut the output there.
    probe = engine.tokenize_chat(agent.messages, tools=TOOLS, thinking=True, enable_thinking=True,
                                 reasoning_effort="high")
    assert isinstance(probe, list), probe
    agent.max_tokens = 32 - len(probe) % 32 + 32  # prompt + output = a multiple of 32
    first = agent.turn()
    assert first["prompt_tokens"] == len(probe)
    assert (first["prompt_tokens"] + first["completion_tokens"]) % 32 == 0
    agent.max_tokens = 16
    second = agent.turn()
    report("output_cut_at_block_boundary", agent.rows)
    assert second["verdict"] == "hit", second
    assert_exact(second)
    # The whole first turn (prompt + output) is in the new prompt, but its last block was never filled.
    assert second["reported"] == first["prompt_tokens"] + first["completion_tokens"] - 32


# -- 2. effort changes mid-conversation ------------------------------------------------------------


def test_effort_change_under_warn_is_drift_and_the_engine_reports_the_collapse(gw):
    agent = Agent(gw, "effort-warn", model="ds-warn", reasoning_effort="high")
    for _ in range(3):
        agent.turn()
    changed = agent.turn(reasoning_effort="max")
    after = agent.turn(reasoning_effort="max")
    report("effort_change_warn", agent.rows)
    assert [r["verdict"] for r in agent.rows[1:3]] == ["hit", "hit"]
    assert changed["effort_header"] == "100; pinned=50; warned"
    assert changed["verdict"] == "drift" and changed["cause"] == "effort_changed", changed
    assert changed["divergence_message_index"] == 0
    assert_exact(changed)  # the collapse the gateway predicted is the one the engine reports
    assert changed["reported"] < 32 < agent.rows[2]["reported"]  # "Reasoning Effort: N" is the second line
    assert changed["tokens_lost"] >= agent.rows[2]["reported"]
    assert after["verdict"] == "hit", after  # the new effort is now the conversation's prefix
    assert_exact(after)


def test_effort_change_under_pin_stays_a_hit(gw):
    agent = Agent(gw, "effort-pin", reasoning_effort="high")
    for _ in range(3):
        agent.turn()
    changed = agent.turn(reasoning_effort="max")
    report("effort_change_pin", agent.rows)
    assert changed["effort_header"] == "50; requested=100; pinned"
    for row in agent.rows[1:]:
        assert row["verdict"] == "hit", row
        assert_exact(row)


# -- 3. chat without tools in thinking mode ------------------------------------------------------


def test_chat_without_tools_drops_reasoning_and_the_engine_agrees(gw):
    """Each new user message makes the template drop the previous answer's reasoning (and turn its
    `<think>` into `</think>`): the prefix moves at that answer, every turn, and the engine's cache
    shows exactly the loss the gateway predicted."""
    agent = Agent(gw, "chat-no-tools", tools=False, max_tokens=40)
    for i in range(5):
        agent.turn(next_user=f"Question {i + 2}, with the log it refers to:\n" + filler(f"q{i}", 3))
    report("chat_without_tools_thinking", agent.rows)
    for prev, row in zip(agent.rows, agent.rows[1:]):
        assert row["verdict"] == "drift" and row["cause"] == "reasoning_dropped_by_template", row
        assert_exact(row)
        # Everything before the previous answer is still cached, nothing of the answer itself.
        assert row["reported"] == prev["prompt_tokens"] // 32 * 32, (prev, row)
        assert row["tokens_lost"] > 0, row
    assert agent.rows[-1]["reported"] > agent.rows[1]["reported"] > 0


# -- 5. timings: the gateway's records agree with the client ---------------------------------------


def test_recorded_first_byte_and_decode_speed_match_the_client(gw):
    """First content byte after an uncached prefill of ~3,800 tokens, and decode speed over 64 tokens:
    what the gateway recorded against what the client measured, for seven conversations.

    The client's clock starts when the request leaves and stops when the chunk is parsed, so it reads a
    little more than the gateway's (1-5 ms of relay). On this 2-core machine, shared with other test
    runs (load average 4-7), one request in three or four also finds the first chunk waiting 20-400 ms
    for a CPU on its way to the client process (which inflates that client's decode figure as well), so
    the agreement within 10% is required of the median, and every figure is printed.
    """
    Agent(gw, "timings-warm-up", max_tokens=2).turn()  # first request of a process: imports, connections
    # A busy spell of the shared machine can delay most chunks of one session on their way to the client;
    # it passes, but in up to three sessions, when one session's medians agree within 10%.
    for session in range(3):
        rows = _timing_session(gw, session)
        median = len(rows) // 2
        ttft_med = sorted(r["ttft_diff"] for r in rows)[median]
        decode_med = sorted(r["decode_diff"] for r in rows)[median]
        print(f"  session {session}: median first-content-byte diff {ttft_med:.1%}, decode diff {decode_med:.1%}")
        if ttft_med <= 0.10 and decode_med <= 0.10:
            break
    assert ttft_med <= 0.10, [round(r["ttft_diff"], 3) for r in rows]
    assert decode_med <= 0.10, [round(r["decode_diff"], 3) for r in rows]


def _timing_session(gw, session: int) -> list[dict]:
    rows = []
    for i in range(7):
        name = f"timings{session}{i}"  # as long as "timings-{i}": the prompt must fit the 4K window
        agent = Agent(gw, name, max_tokens=64, opening="\n" + filler(name, 155))
        row = agent.turn()
        rec = wait_record(gw, agent.cid, row["turn"])
        row.update(gw_ttft_s=rec["ttft_s"], gw_decode_tps=rec["decode_tps"], decode_source=rec["decode_source"])
        row["ttft_diff"] = abs(rec["ttft_s"] - row["client_ttft_s"]) / row["client_ttft_s"]
        row["decode_diff"] = abs(rec["decode_tps"] - row["client_decode_tps"]) / row["client_decode_tps"]
        rows.append(row)
    report("timings", rows)
    for r in rows:
        print(f"  first content byte: client {r['client_ttft_s'] * 1000:.1f} ms, gateway {r['gw_ttft_s'] * 1000:.1f} ms"
              f" ({r['ttft_diff']:.1%}, {r['prompt_tokens']} prompt tokens); decode: client "
              f"{r['client_decode_tps']:.1f} tok/s, gateway {r['gw_decode_tps']:.1f} tok/s ({r['decode_diff']:.1%},"
              f" {r['completion_tokens']} tokens)")
    for r in rows:
        assert_first_turn(r)
        assert r["completion_tokens"] == 64, r
        assert r["decode_source"] == "usage"
        assert r["gw_ttft_s"] <= r["client_ttft_s"], r  # the gateway's clock starts after the client's
    return rows


# -- 4. a KV pool too small: eviction, not drift -----------------------------------------------------


def test_interleaved_long_conversations_evict_each_other(gw, engine):
    """Three conversations of ~1,550 tokens (49 blocks) take turns on a 127-block pool: every prefix is
    stable, and each returning conversation finds the tail of its prefix evicted by the other two
    (vLLM evicts the least recently freed blocks, a request's tail first)."""
    agents = [Agent(gw, f"evict-{i}", user=f"evict-{i}", opening="\n" + filler(f"evict-{i}", 50)) for i in range(3)]
    for _ in range(3):
        for ag in agents:
            ag.turn()
    for i, ag in enumerate(agents):
        report(f"eviction_conversation_{i}", ag.rows)
    later = [r for ag in agents for r in ag.rows[1:]]
    for ag in agents:
        assert_first_turn(ag.rows[0])
    assert sum(ag.rows[0]["prompt_tokens"] for ag in agents) > (engine.pool_blocks - 1) * engine.block_size
    for r in later:  # never drift: the prefixes were stable; the engine let them go
        assert r["verdict"] == "eviction" and r["cause"] is None, r
        assert r["reported"] < r["predicted"] and r["tokens_lost"] == r["predicted"] - r["reported"], r
        assert r["reported"] % 32 == 0 and r["render_matches_engine"] is True, r
    assert any(r["reported"] > 0 for r in later), "no partial eviction: the head of some prefix should survive"


# -- token ids: the gateway asks vLLM for them itself ------------------------------------------


def test_every_turn_compares_the_engines_token_ids_and_the_client_sees_none(gw):
    # The client never asks for return_token_ids: the gateway does, so the record compares the ids the
    # engine prefilled with the render (content, not counts) on every turn.
    agent = Agent(gw, "token-ids")
    for _ in range(6):
        agent.turn()
    report("token_ids_every_turn", agent.rows)
    assert all(r["render_check"] == "token_ids" for r in agent.rows), agent.rows
    for row in agent.rows[1:]:
        assert row["verdict"] == "hit", row
        assert_exact(row)


def _stream(url: str, body: dict[str, Any]) -> list[bytes]:
    """A raw stream's data events (without [DONE])."""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        raw = r.read()
    return [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]


def _said(events: list[bytes]) -> tuple[str, str, str | None]:
    """What a stream says: its reasoning, its content and how it finished (vLLM merges deltas into fewer
    chunks when its output queue runs behind, so chunk boundaries differ from run to run under load)."""
    reasoning, content, finish = "", "", None
    for e in events:
        for choice in json.loads(e[5:])["choices"]:
            delta = choice.get("delta") or {}
            reasoning += delta.get("reasoning") or ""
            content += delta.get("content") or ""
            finish = choice.get("finish_reason") or finish
    return reasoning, content, finish


def test_stripped_ids_leave_the_stream_vllm_sends_unasked(gw, engine):
    # Unbiased and thinking, the random model emits special tokens the reasoning parser swallows (measured:
    # 19 of 40): asked for ids, vLLM sends a chunk with an empty delta for each of them; unasked it sends
    # none. Each request has its own cache_salt, so both are prefilled cold and generate the same tokens
    # (temperature 0).
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Explain a prefix cache in one line."}],
            "max_tokens": 40, "temperature": 0, "stream": True, "ignore_eos": True,
            "chat_template_kwargs": {"thinking": True}}
    plain = _stream(engine.url, {**body, "cache_salt": "plain"})
    asked = _stream(engine.url, {**body, "cache_salt": "asked", "return_token_ids": True})
    assert any(b'"token_ids":[' in e for e in asked) and not any(b'"token_ids":[' in e for e in plain)
    stripped = [token_ids.strip_chunk(e)[0] for e in asked]
    kept = [c for c in stripped if c is not None]
    assert len(stripped) - len(kept) > 5  # the id-only chunks, dropped
    assert not any(b'token_ids":[' in c or (b'"delta":{}' in c and b'"finish_reason":null' in c) for c in kept)
    assert _said(kept) == _said(plain) and _said(plain)[0]
    # Through the gateway (which asks): no ids, and no chunk vLLM would not have sent unasked.
    through = _stream(gw.url, {**body, "model": "ds", "cache_salt": "through", "user": "token-ids-raw"})
    assert not any(b'token_ids":[' in e for e in through)
    assert not any(b'"delta":{}' in e and b'"finish_reason":null' in e for e in through)
    print(f"\nasked {len(asked)} chunks, unasked {len(plain)}, stripped {len(kept)}, through the gateway "
          f"{len(through)}")


def test_output_that_re_renders_to_other_ids_is_output_retokenized_not_eviction(gw):
    # Unbiased, the random model emits special tokens the parsers swallow: the text the client sends back
    # renders to other ids than the engine generated, so the engine holds fewer tokens than the render
    # predicts. With the generated ids (asked by the gateway) the shortfall is named for what it is.
    agent = Agent(gw, "retokenized", logit_bias=None, max_tokens=96)
    agent.turn()
    row = agent.turn()
    report("output_retokenized", agent.rows)
    assert row["verdict"] == "drift" and row["cause"] == "output_retokenized", row
    assert row["reported"] < row["predicted"], row
