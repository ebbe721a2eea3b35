"""Requests to a running gateway, and the records it stores of them (written after the response: the
analysis, then the batched writer), read through its admin API.

    status, raw = post(gw.url, {"model": "agent", "messages": prompt_of(1)})
    recs = records(gw.url)                     # once every request sent through `post` is recorded
    rec = record_of(gw, r.headers["x-request-id"])
"""

from __future__ import annotations

import json
import time  # request ids
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any

import httpx

from tests.support.poll import TIMEOUT_S, wait_until

# A tool the scripted agents declare (an agent's request carries tools; its answers may call them).
TOOLS = [{"type": "function", "function": {"name": "run", "description": "run a shell command",
                                           "parameters": {"type": "object",
                                                          "properties": {"cmd": {"type": "string"}}}}}]
SENT: dict[str, list[str]] = defaultdict(list)  # gateway URL -> request ids sent to it through `post`, in order


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A chat completion with a request id of its own (kept in SENT); the status and the raw body."""
    rid = f"t-{time.time_ns()}"
    SENT[url].append(rid)
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": rid, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


def records(gw_url: str, ids: list[str] | None = None, timeout: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Every record (oldest first), once those of `ids` (default: all sent through `post` so far) exist;
    what is there when the timeout passes otherwise (the caller's assertions say what is missing)."""
    want = set(SENT[gw_url] if ids is None else ids)
    seen: list[dict[str, Any]] = []

    def complete() -> bool:
        seen[:] = get_json(f"{gw_url}/admin/api/records?limit=5000")["records"]
        return want <= {r["request_id"] for r in seen}

    try:
        wait_until(complete, timeout, "the records", interval=0.1)
    except AssertionError:
        pass  # the caller's assertions name what is missing
    return list(reversed(seen))


def sent_since(gw_url: str, mark: int) -> list[str]:
    return SENT[gw_url][mark:]


def prompt_of(i: int, words: int = 700) -> list[dict[str, Any]]:
    """A user message of `words` distinct words, distinct for each `i`: no two prompts share a block."""
    text = " ".join(f"w{i}x{j}" for j in range(words))
    return [{"role": "user", "content": text}]


def recent(gw, limit: int = 50, headers: dict[str, str] | None = None, **params: Any) -> list[dict[str, Any]]:
    """The newest records first, as /admin/api/records lists them (`params`: its filters)."""
    r = httpx.get(gw.url + "/admin/api/records", params={"limit": limit, **params}, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["records"]


def record_of(gw, request_id: str, timeout: float = TIMEOUT_S, headers: dict[str, str] | None = None,
              limit: int = 200) -> dict[str, Any]:
    """The record of request `request_id`, once it is stored."""
    return wait_until(lambda: next((r for r in recent(gw, limit, headers) if r["request_id"] == request_id), None),
                      timeout, f"the record of {request_id}", detail=lambda: gw.log()[-2000:])


def agent_turns(gw_url: str, emu, conversation: str, settle: bool = False) -> list[dict[str, Any]]:
    """Five turns of a scripted agent on public model "agent": cold, append-only (hit), edited system
    prompt (drift), append-only (hit), cache flushed on the engine (eviction). Returns the records of
    this conversation, oldest first (`settle`: each turn's record is waited for before the next)."""
    system = f"You are a careful coding agent ({conversation})."
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system},
                                  {"role": "user", "content": "Write a function that adds two numbers."}]
    headers = {"X-Conversation-Id": conversation}
    mark = len(SENT[gw_url])
    for step in range(5):
        if step == 2:  # a client that stamps the date into its system prompt
            msgs[0] = {"role": "system", "content": system + " Today is 2025-01-01."}
        if step == 4:
            emu.reset(config=False)  # the engine lost its prefix cache
        status, raw = post(gw_url, {"model": "agent", "messages": msgs, "tools": TOOLS}, headers)
        assert status == 200, raw
        msg = json.loads(raw)["choices"][0]["message"]
        msg.setdefault("reasoning_content", msg.get("reasoning"))  # vLLM says `reasoning`; send it back as clients do
        keep = {k: v for k, v in msg.items() if k in ("role", "content", "reasoning_content", "tool_calls") and v}
        msgs = msgs + [keep, {"role": "user", "content": f"Now step {step + 1}, please."}]
        if settle:  # wait for this turn's analysis before sending the next
            records(gw_url)
    ids = sent_since(gw_url, mark)
    return [r for r in records(gw_url, timeout=60) if r["request_id"] in ids]
