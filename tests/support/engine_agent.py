"""An agent against the real engine (tests/support/engine_proc.py), for the engine test files: the
random-weight model confined to whole words, an append-only agent that records each turn's figures,
and the per-turn report written to tests/artifacts/engine-cache.json (test_engine_cache.py's fixture).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai

from tests.support.poll import TIMEOUT_S, wait_until
from tests.support.streamed_turn import add_tool_call_deltas, append_turn

# Whole words with a leading space: each one token, and a run of them re-encodes to the same tokens.
WORDS = {" the": 270, " code": 4181, " file": 4245, " read": 1733, " test": 1950, " fix": 11284,
         " split": 14241, " value": 1990, " line": 2562, " check": 4085}
LOGIT_BIAS = {str(i): 100 for i in WORDS.values()}
TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file from the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite, optionally one test.",
        "parameters": {"type": "object", "properties": {"select": {"type": "string"}}}}},
]
REPORT: dict[str, Any] = {}  # test name -> its turns, written out by test_engine_cache.py


def wait_turn(gw, cid: str, turn: int, timeout: float = TIMEOUT_S) -> dict:
    """The conversation's admin view once `turn` has been analysed and judged (its last_cache set)."""
    def judged() -> dict | None:
        r = httpx.get(f"{gw.url}/admin/conversations/{cid}")
        return r.json() if r.status_code == 200 and r.json()["turn"] >= turn and r.json().get("last_cache") else None

    return wait_until(judged, timeout, f"turn {turn} of {cid} to be judged", interval=0.02,
                      detail=lambda: gw.log()[-3000:])


def filler(tag: str, lines: int) -> str:
    """Deterministic, distinct text of about 13 tokens a line."""
    return "\n".join(f"{tag} line {i}: value = compute({i}, {i * 7 % 13}) + offset_{i % 5}" for i in range(lines))


class Agent:
    """An append-only agent: appends what the engine returned, then its next user message.

    `tag` opens the system prompt, so no two tests share a cached block beyond the first few tokens.
    """

    def __init__(self, gw, tag: str, *, model: str = "ds", tools: bool = True, max_tokens: int = 16,
                 opening: str = "", reasoning_field: str = "reasoning_content", **kw: Any) -> None:
        self.gw = gw
        self.tag = tag
        # The client's clock starts when the request leaves (httpx's request hook), not when the openai
        # library starts building it (its first call in a process costs ~100 ms of lazy setup).
        self.t_sent = 0.0
        http = httpx.Client(timeout=120, event_hooks={"request": [self._sent]})
        self.client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, http_client=http)
        self.model = model
        self.tools = TOOLS if tools else None
        self.max_tokens = max_tokens
        self.kw = kw
        self.cid: str | None = None
        self.turns = 0
        self.rows: list[dict[str, Any]] = []
        self.reasoning_field = reasoning_field  # "reasoning": sent back exactly as vLLM streamed it
        system = f"[{tag}] You are a coding agent working in a Python repository. Read files before you change them."
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        if tools:
            # The client's own history of a tool call (a resumed session), rendered on every turn.
            self.messages += [
                {"role": "user", "content": "test_split fails on empty input. Find out why." + opening},
                {"role": "assistant", "content": "", "reasoning_content": "Read the implementation first.",
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "read_file",
                                              "arguments": json.dumps({"path": "src/split.py"})}}]},
                {"role": "tool", "tool_call_id": "call_1",
                 "content": [{"type": "text", "text": "def split(s, sep=','):"},
                             {"type": "text", "text": "    return s.split(sep)"}]},
                {"role": "user", "content": "Go on: fix it and run the tests."},
            ]
        else:
            self.messages.append({"role": "user", "content": "Explain what a prefix cache is." + opening})

    def _sent(self, request: httpx.Request) -> None:
        self.t_sent = time.perf_counter()

    def turn(self, next_user: str | None = None, **kw: Any) -> dict[str, Any]:
        args: dict[str, Any] = dict(model=self.model, messages=self.messages, max_tokens=self.max_tokens,
                                    temperature=0, logit_bias=LOGIT_BIAS, stream=True,
                                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        if self.tools:
            args["tools"] = self.tools
        args.update(self.kw)
        args.update(kw)
        raw = self.client.chat.completions.with_raw_response.create(**args)
        t0 = self.t_sent
        headers = dict(raw.headers)
        reasoning, content, calls, usage, finish = "", "", {}, None, None
        t_first = t_last = None
        for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            ch = chunk.choices[0]
            d = ch.delta
            piece_r = (d.model_extra or {}).get("reasoning") or (d.model_extra or {}).get("reasoning_content") or ""
            piece_c = d.content or ""
            if piece_r or piece_c or d.tool_calls:
                now = time.perf_counter()
                t_first = t_first or now
                t_last = now
            reasoning += piece_r
            content += piece_c
            add_tool_call_deltas(calls, d.tool_calls)
            finish = ch.finish_reason or finish
        append_turn(self.messages, content, reasoning, self.reasoning_field, calls, f"ok ({self.turns})",
                    next_user or f"Step {self.turns + 1}: continue.")
        self.cid = headers["x-gateway-conversation"].split(";")[0]
        self.turns += 1
        state = wait_turn(self.gw, self.cid, self.turns)
        cache = state["last_cache"]
        n = usage.completion_tokens if usage else None
        row = {
            "turn": self.turns, "verdict": cache["verdict"], "cause": cache.get("cause"),
            "predicted": cache["predicted_cached_tokens"], "reported": cache["reported_cached_tokens"],
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "rendered_prompt_tokens": cache.get("rendered_prompt_tokens"), "lcp_tokens": cache.get("lcp_tokens"),
            "tokens_lost": cache.get("tokens_lost"), "divergence_message_index": cache.get("divergence_message_index"),
            "render_matches_engine": cache.get("render_matches_engine"), "render_check": cache.get("render_check"),
            "effort_header": headers.get("x-gateway-effort"), "finish_reason": finish, "completion_tokens": n,
            "client_ttft_s": None if t_first is None else t_first - t0,
            "client_decode_tps": (n - 1) / (t_last - t_first) if n and n > 1 and t_last and t_last > t_first else None,
            "output": (reasoning + content)[:60],
        }
        self.rows.append(row)
        return row


def report(name: str, agent_rows: list[dict[str, Any]], **extra: Any) -> None:
    REPORT[name] = {"turns": agent_rows, **extra}
    print(f"\n{name}")
    for r in agent_rows:
        print(f"  turn {r['turn']:>2} {r['verdict']:<8} {str(r['cause'] or ''):<30} predicted {r['predicted']!s:>5} "
              f"reported {r['reported']!s:>5} prompt {r['prompt_tokens']!s:>5} lost {r['tokens_lost']!s:>5}"
              f"  effort {r['effort_header']}")


def assert_exact(row: dict[str, Any]) -> None:
    assert row["predicted"] == row["reported"], row
    assert row["predicted"] % 32 == 0, row
    assert row["render_matches_engine"] is True, row
    assert row["finish_reason"] == "length" and row["completion_tokens"] is not None, row


def assert_first_turn(row: dict[str, Any]) -> None:
    """A conversation's first turn: cold, or a hit on the head (system prompt, tools) another
    conversation left on the engine, predicted exactly."""
    assert row["verdict"] == "cold" or (row["verdict"] == "hit" and row["cause"] == "shared_prefix"
                                        and row["predicted"] == row["reported"]), row
