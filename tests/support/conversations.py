"""An append-only agent through the gateway, and waiting for the gateway's analysis of a conversation
turn (it runs after the response)."""

from __future__ import annotations

import httpx
import openai

from tests.support.poll import TIMEOUT_S, wait_until


def wait_analysed(gw, cid: str, turn: int, timeout: float = TIMEOUT_S, headers: dict | None = None) -> dict:
    """The conversation's admin view once `turn` has been analysed (`headers`: e.g. the admin key)."""
    def analysed() -> dict | None:
        r = httpx.get(f"{gw.url}/admin/conversations/{cid}", headers=headers)
        return r.json() if r.status_code == 200 and r.json()["turn"] >= turn else None

    return wait_until(analysed, timeout, f"turn {turn} of {cid} to be analysed", interval=0.02,
                      detail=lambda: gw.log()[-3000:])


def wait_record(gw, cid: str, turn: int, timeout: float = TIMEOUT_S) -> dict:
    """The stored record of `turn` of conversation `cid` once its analysis is in it."""
    def judged() -> dict | None:
        rows = httpx.get(f"{gw.url}/admin/api/records", params={"conversation": cid, "limit": 50}).json()["records"]
        return next((row for row in rows if row.get("turn") == turn
                     and row.get("verdict") not in (None, "unknown")), None)

    return wait_until(judged, timeout, f"the judged record of turn {turn} of {cid}")


TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file from the workspace.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
SYSTEM = "You are a coding agent. Read files before you change them."


class Agent:
    """An append-only agent client: keeps the assistant's output (reasoning included) in its history.

    `echo_field`: the name under which the reasoning is sent back; None sends it back under the name
    it arrived with (vLLM streams `reasoning`, SGLang `reasoning_content`): exactly what was relayed."""

    def __init__(self, gw, *, tools: bool = True, stream: bool = True, model: str = "ds",
                 echo_field: str | None = "reasoning_content", **kw) -> None:
        self.gw = gw
        self.client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM},
                                     {"role": "user", "content": "Find why test_split fails and fix it."}]
        self.tools = TOOLS if tools else None
        self.stream = stream
        self.kw = kw
        self.cid: str | None = None
        self.turns = 0
        self.model = model
        self.echo_field = echo_field

    def cold_then_hits(self, hits: int) -> list[dict]:
        """A first turn (cold), then `hits` turns that must each hit with predicted == reported cached
        tokens; the analyses, first turn's included."""
        _, first = self.turn()
        assert first["verdict"] == "cold", first
        caches = [first]
        for _ in range(hits):
            _, cache = self.turn()
            assert cache["verdict"] == "hit", cache
            assert cache["predicted_cached_tokens"] == cache["reported_cached_tokens"] > 0, cache
            caches.append(cache)
        return caches

    def turn(self, extra_headers: dict | None = None, wait: bool = True, **kw) -> tuple[dict, dict]:
        # 8 reasoning tokens (the emulator's knob) + 12 of content: max_tokens counts reasoning, as on the engines
        args = {"model": self.model, "messages": self.messages, "max_tokens": 20, **self.kw, **kw}
        if self.tools:
            args["tools"] = self.tools
        raw = self.client.chat.completions.with_raw_response.create(stream=self.stream, extra_headers=extra_headers,
                                                                     **args)
        headers = dict(raw.headers)
        msg = {"role": "assistant", "content": "", "reasoning_content": ""}
        arrived = set()
        calls: dict[int, dict] = {}
        if self.stream:
            for chunk in raw.parse():
                if not chunk.choices:
                    continue
                d = chunk.choices[0].delta
                msg["content"] += d.content or ""
                extra = d.model_extra or {}
                for f in ("reasoning", "reasoning_content"):
                    if extra.get(f):
                        arrived.add(f)
                msg["reasoning_content"] += extra.get("reasoning") or extra.get("reasoning_content") or ""
                for tc in d.tool_calls or []:
                    c = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
                    c["function"]["name"] += tc.function.name or ""
                    c["function"]["arguments"] += tc.function.arguments or ""
        else:
            m = raw.parse().choices[0].message
            msg["content"] = m.content or ""
            extra = m.model_extra or {}
            arrived.update(f for f in ("reasoning", "reasoning_content") if extra.get(f))
            msg["reasoning_content"] = extra.get("reasoning") or extra.get("reasoning_content") or ""
            for i, tc in enumerate(m.tool_calls or []):
                calls[i] = {"id": tc.id, "type": "function",
                            "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
        if not msg["reasoning_content"]:
            del msg["reasoning_content"]
        else:
            field = self.echo_field or ("reasoning" if "reasoning" in arrived else "reasoning_content")
            msg[field] = msg.pop("reasoning_content")
        if calls:
            msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        self.messages.append(msg)
        for c in msg.get("tool_calls", []):
            self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": f"contents of {self.turns}.py\n"
                                  + "def f(x):\n    return x * 2\n" * 5})
        if not calls:
            self.messages.append({"role": "user", "content": f"Continue with step {self.turns}."})
        self.cid = headers["x-gateway-conversation"].split(";")[0]
        self.turns += 1
        if not wait:
            return headers, {}
        state = wait_analysed(self.gw, self.cid, self.turns)
        return headers, state["last_cache"]
