"""An append-only agent conversation through the official client, turn by turn, against any gateway URL."""

from __future__ import annotations

import openai

from tests.support.conversations import wait_analysed

# With tools the DeepSeek-V4.1 template keeps earlier reasoning (without, it drops it at the next user
# message: a drift by design), so an agent's conversation is append-only and every turn can hit.
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


class Conversation:
    """Keeps the model's output (reasoning and tool calls included) in the history, as agents do; any turn
    may go to another gateway (`turn(gw)`), the conversation is the same."""

    def __init__(self, model: str, system: str = "You are a careful coding agent.") -> None:
        self.model = model
        self.messages: list[dict] = [{"role": "system", "content": system},
                                     {"role": "user", "content": "Find why test_split fails and fix it."}]
        self.cid: str | None = None
        self.turns = 0

    def turn(self, gw, max_tokens: int = 16) -> dict:
        """One streamed turn through `gw` (anything with .url and .log()); returns the cache verdict of it."""
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=30)
        raw = client.chat.completions.with_raw_response.create(model=self.model, messages=self.messages,
                                                               max_tokens=max_tokens, stream=True, tools=TOOLS)
        msg: dict = {"role": "assistant", "content": ""}
        reasoning = ""
        calls: dict[int, dict] = {}
        for chunk in raw.parse():
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            msg["content"] += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning") or ""
            for tc in delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": tc.id, "type": "function",
                                                "function": {"name": "", "arguments": ""}})
                c["function"]["name"] += tc.function.name or ""
                c["function"]["arguments"] += tc.function.arguments or ""
        if reasoning:
            msg["reasoning_content"] = reasoning
        if calls:
            msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        self.turns += 1
        self.messages.append(msg)
        for c in msg.get("tool_calls", []):
            self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": f"contents of step {self.turns}"})
        if not calls:
            self.messages.append({"role": "user", "content": f"Continue with step {self.turns}."})
        cid = raw.headers["x-gateway-conversation"].split(";")[0]
        assert self.cid in (None, cid), f"turn {self.turns} landed in conversation {cid}, not {self.cid}"
        self.cid = cid
        return wait_analysed(gw, cid, self.turns, timeout=20)["last_cache"]
