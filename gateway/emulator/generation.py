"""What the emulated model says: a deterministic plan of reasoning, content and tool-call pieces.

One piece is one token and one stream chunk. Chat content pieces are "w0", " w1", ... so the text a
client reassembles splits back into the same words (the simple tokenizer's tokens).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from .config import EmulatorConfig

_WORDS = """the a of to and in is it that for on with as was at by this be from or an are not have
    cache prefix token block model lane stream chunk route render template engine server request
    answer reason think check value result weather city river mountain forest ocean garden window
    bridge market station signal vector matrix kernel thread socket buffer packet latency
    quick slow bright quiet gentle steady rapid calm clear simple careful honest useful modern
    write read build test measure compare explain follow return handle update select compute
    first second next last early later often always never maybe perhaps indeed therefore however
    blue green amber silver golden purple crimson violet orange yellow black white grey brown
    north south east west upper lower inner outer middle central remote local global partial
    apple bread cheese honey lemon mango olive pepper rice salt sugar tea water wine yogurt
    alpha beta gamma delta epsilon zeta theta lambda sigma omega kappa iota
    one two three four five six seven eight nine ten hundred thousand
    paper stone glass metal wood cloud rain snow wind storm light shadow night morning evening
    table chair door floor roof wall field road path hill valley lake shore island harbor tower
    cat dog bird fish horse mouse lion tiger bear wolf fox deer owl crow swan frog bee ant
    run walk jump swim fly sing dance speak listen watch learn teach play work rest sleep
    small large short long wide narrow deep shallow heavy light warm cold fresh stale sharp soft
    music story letter number answer question idea plan reason method system process detail
    copper iron nickel zinc cobalt carbon oxygen helium neon argon silicon sodium calcium
    monday tuesday friday summer winter spring autumn year month week hour minute second""".split()
# Exactly 256 distinct words: one random byte picks one word.
_VOCAB = tuple(dict.fromkeys(_WORDS))[:256]


@dataclass(slots=True)
class ToolCallPlan:
    name: str
    arguments: str  # the whole JSON text
    fragments: list[str]  # vLLM-style argument fragments; "".join(fragments) == arguments
    stream_id: str  # call_<24 hex>, both engines while streaming
    final_id: str  # vLLM non-streaming uses chatcmpl-tool-<32 hex>


@dataclass(slots=True)
class Plan:
    reasoning: list[str]
    content: list[str]
    tool_call: ToolCallPlan | None
    finish_reason: str
    tool_tokens: int

    @property
    def completion_tokens(self) -> int:
        return len(self.reasoning) + len(self.content) + self.tool_tokens

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def content_text(self) -> str:
        return "".join(self.content)

    def assistant_message(self) -> dict[str, Any]:
        """The assistant message as an append-only client sends it back next turn."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content_text}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning_text
        if self.tool_call is not None:
            tc = self.tool_call
            msg["tool_calls"] = [
                {"id": tc.stream_id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
            ]
        return msg


def thinking_enabled(body: dict[str, Any], default: bool) -> bool:
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict):
        for key in ("thinking", "enable_thinking"):
            if key in kwargs and kwargs[key] is not None:
                return bool(kwargs[key])
    effort = body.get("reasoning_effort")
    if effort is not None:
        return str(effort).lower() != "none"
    return default


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(0, value)
    return None


def _rng(body: dict[str, Any], prompt_digest: int, cfg: EmulatorConfig) -> random.Random:
    seed = body.get("seed")
    temperature = body.get("temperature")
    nonce = 0
    if seed is None and isinstance(temperature, (int, float)) and temperature > 0:
        nonce = random.getrandbits(64)  # sampling without a seed: free to vary
    key = f"{cfg.seed}|{cfg.output_salt}|{seed}|{nonce}".encode()
    return random.Random(xxhash.xxh3_64_intdigest(key, prompt_digest))


def _pieces(rng: random.Random, n: int, lead_space: bool) -> list[str]:
    vocab = _VOCAB
    words = [vocab[b] for b in rng.getrandbits(8 * n).to_bytes(n, "little")] if n else []
    if not lead_space and words:
        return [words[0], *(" " + w for w in words[1:])]
    return [" " + w for w in words]


def _last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or ()):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):
                return " ".join(str(p.get("text") or "") for p in c if isinstance(p, dict))
            return ""
    return str(body.get("prompt") or "")


def _chosen_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools")
    messages = body.get("messages") or []
    if not tools or not isinstance(tools, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    choice = body.get("tool_choice")
    if choice == "none":
        return None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        for t in tools:
            if isinstance(t, dict) and (t.get("function") or {}).get("name") == wanted:
                return t
    first = tools[0]
    return first if isinstance(first, dict) else None


# Tools an agent CLI runs commands with (Codex exec_command and shell, Claude Code Bash, Qwen Code
# run_shell_command, OpenCode bash, Gemini and others), and the name of their command parameter.
_SHELL_NAMES = ("shell", "bash", "exec_command", "run_shell_command", "local_shell", "run_terminal_cmd",
                "execute_command", "terminal", "run_command", "command")
_COMMAND_PARAMS = ("command", "cmd")
HARMLESS_COMMAND = "echo ok"


def _shell_tool(tools: list[Any]) -> tuple[dict[str, Any], str, bool] | None:
    """The request's shell tool: (tool, its command parameter, whether it takes an argv array)."""
    best = None
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            continue
        props = (fn.get("parameters") or {}).get("properties") if isinstance(fn.get("parameters"), dict) else None
        if not isinstance(props, dict):
            continue
        param = next((p for p in _COMMAND_PARAMS if isinstance(props.get(p), dict)), None)
        if param is None:
            continue
        as_array = props[param].get("type") == "array"
        name = str(fn.get("name") or "").lower()
        if name in _SHELL_NAMES or name.split("__")[-1] in _SHELL_NAMES:
            return t, param, as_array
        best = best or (t, param, as_array)
    return best


def _rounds_since_user(messages: list[Any]) -> int | None:
    """Tool-call rounds after the last user message (None: the history has no user message)."""
    rounds = 0
    for m in reversed(messages):
        if not isinstance(m, dict):
            continue
        if m.get("role") == "user":
            return rounds
        if m.get("role") == "assistant" and m.get("tool_calls"):
            rounds += 1
    return None


def _agent_call(body: dict[str, Any], cfg: EmulatorConfig, rng: random.Random) -> "ToolCallPlan | None":
    """An agent's next step: run a harmless command with the client's shell tool, `agent_tool_turns`
    rounds after the user's message, then answer."""
    tools = body.get("tools")
    if not isinstance(tools, list) or body.get("tool_choice") == "none":
        return None
    rounds = _rounds_since_user(body.get("messages") or [])
    if rounds is None or rounds >= cfg.agent_tool_turns:
        return None
    found = _shell_tool(tools)
    if found is None:
        return None
    tool, param, as_array = found
    value: Any = HARMLESS_COMMAND.split() if as_array else HARMLESS_COMMAND
    name = str(tool["function"].get("name"))
    pair = orjson.dumps(param).decode() + ": " + _dumps_spaced(value)
    return ToolCallPlan(name=name, arguments="{" + pair + "}", fragments=["{", pair, "}"],
                        stream_id=f"call_{rng.getrandbits(96):024x}",
                        final_id=f"chatcmpl-tool-{rng.getrandbits(128):032x}")


def _value_for(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    if not isinstance(schema, dict):
        return rng.choice(_VOCAB)
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "integer":
        return rng.randint(1, 100)
    if kind == "number":
        return round(rng.random() * 100, 2)
    if kind == "boolean":
        return True
    if kind == "array":
        return [_value_for(schema.get("items"), rng, depth + 1)] if depth < 3 else []
    if kind == "object":
        return _object_for(schema, rng, depth + 1) if depth < 3 else {}
    return rng.choice(_VOCAB)


def _object_for(schema: dict[str, Any], rng: random.Random, depth: int = 0) -> dict[str, Any]:
    props = schema.get("properties") or {}
    required = schema.get("required") or []
    return {name: _value_for(props.get(name), rng, depth) for name in required if isinstance(name, str)}


def _tool_call(tool: dict[str, Any], rng: random.Random) -> ToolCallPlan:
    fn = tool.get("function") or {}
    name = str(fn.get("name") or "tool")
    params = p if isinstance(p := fn.get("parameters"), dict) else {}
    args = _object_for(params, rng)
    # json.dumps default separators, as DeepSeek's parsers re-serialise arguments.
    pairs = [orjson.dumps(k).decode() + ": " + _dumps_spaced(v) for k, v in args.items()]
    arguments = "{" + ", ".join(pairs) + "}"
    fragments = ["{"] + [(", " if i else "") + p for i, p in enumerate(pairs)] + ["}"]
    return ToolCallPlan(
        name=name,
        arguments=arguments,
        fragments=fragments,
        stream_id=f"call_{rng.getrandbits(96):024x}",
        final_id=f"chatcmpl-tool-{rng.getrandbits(128):032x}",
    )


def _dumps_spaced(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # the stdlib gives Python's ", " / ": " spacing


def plan_chat(body: dict[str, Any], prompt_digest: int, cfg: EmulatorConfig, choice: int = 0) -> Plan:
    """One choice of a chat answer. `max_tokens` counts reasoning too, as on the engines: reasoning
    first (up to the knob), the rest of the budget for content. `choice` (n > 1) varies the words."""
    max_tokens = requested_max_tokens(body)
    ignore_eos = bool(body.get("ignore_eos"))
    last_user = _last_user_text(body)
    if not ignore_eos and any(s and s in last_user for s in cfg.empty_output_prompts):
        return Plan([], [], None, "stop", 0)  # the model emitted EOS at once
    rng = _rng(body, prompt_digest + choice, cfg)
    n_reason = cfg.reasoning_tokens if thinking_enabled(body, cfg.default_thinking) else 0
    if max_tokens is not None:
        n_reason = min(n_reason, max_tokens)
        n_content = max_tokens - n_reason
    else:
        n_content = cfg.output_tokens
    natural = None
    if cfg.answer_tokens:
        natural = rng.randint(max(1, cfg.answer_tokens // 4), cfg.answer_tokens)
        n_content = min(n_content, natural) if max_tokens is not None else natural
    reasoning = _pieces(rng, n_reason, lead_space=False)
    if cfg.agent_tool_turns:
        call = _agent_call(body, cfg, rng)
        if call is not None:  # an agent's model calls its tool without a word around it
            return Plan(reasoning, [], call, "tool_calls", len((call.name + " " + call.arguments).split()))
        tool = None
    else:
        tool = _chosen_tool(body)
    if tool is not None:
        content = _pieces(rng, n_content, lead_space=False)
        call = _tool_call(tool, rng)
        tool_tokens = len((call.name + " " + call.arguments).split())
        return Plan(reasoning, content, call, "tool_calls", tool_tokens)
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        fmt = {}
    kind = fmt.get("type")
    if kind in ("json_object", "json_schema"):
        # Valid JSON text (json_schema: an object of the schema's shape), cut short only by max_tokens.
        schema = (fmt.get("json_schema") or {}).get("schema") if kind == "json_schema" else None
        if isinstance(schema, dict):
            obj: Any = _object_for(schema, rng)
        else:
            obj = {"answer": "".join(_pieces(rng, max(1, min(cfg.output_tokens, 8)), lead_space=False))}
        content = _json_pieces(json.dumps(obj, ensure_ascii=False))
        if max_tokens is not None and len(content) > n_content:
            return Plan(reasoning, content[:n_content], None, "length", 0)
        return Plan(reasoning, content, None, "stop", 0)
    content = _pieces(rng, n_content, lead_space=False)
    # Hitting max_tokens (or never stopping: ignore_eos) is "length"; the knob's natural end is "stop".
    if natural is not None and not ignore_eos:
        finish = "length" if max_tokens is not None and natural > max_tokens - n_reason else "stop"
    else:
        finish = "length" if max_tokens is not None or ignore_eos else "stop"
    return Plan(reasoning, content, None, finish, 0)


def _json_pieces(text: str) -> list[str]:
    """JSON text as tokens of a few characters ("".join gives the text back)."""
    return [text[i:i + 4] for i in range(0, len(text), 4)]


def plan_completion(body: dict[str, Any], prompt_digest: int, cfg: EmulatorConfig) -> Plan:
    max_tokens = requested_max_tokens(body)
    if not body.get("ignore_eos") and any(s and s in _last_user_text(body) for s in cfg.empty_output_prompts):
        return Plan([], [], None, "stop", 0)
    rng = _rng(body, prompt_digest, cfg)
    n = max_tokens if max_tokens is not None else cfg.output_tokens
    # Leading spaces: prompt + generated text re-tokenizes as prompt tokens + generated tokens.
    return Plan([], _pieces(rng, n, lead_space=True), None, "length" if max_tokens is not None else "stop", 0)
