"""In-process checks of the emulator's building blocks: tokenizer prefix property, prefix cache, config."""

from __future__ import annotations

import json

import pytest

from gateway.emulator import EmulatorConfig
from gateway.emulator.cache import PrefixCache, token_bytes
from gateway.emulator.generation import plan_chat
from gateway.emulator.tokens import simple_tokenize_generated, simple_tokenize_prompt

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"},
                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                               "days": {"type": "integer"}},
                "required": ["city", "unit"],
            },
        },
    }
]


def _turn(body: dict, cfg: EmulatorConfig) -> tuple[list[int], list[int], dict]:
    prompt = simple_tokenize_prompt(body)
    plan = plan_chat(body, 1234, cfg)
    msg = plan.assistant_message()
    return prompt, simple_tokenize_generated(body, msg), msg


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_append_only_turn_starts_with_prompt_plus_generated(thinking: bool, tools: list | None) -> None:
    cfg = EmulatorConfig(default_thinking=thinking)
    body: dict = {"messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "weather in Paris?"}]}
    if tools:
        body["tools"] = tools
    prompt, gen, msg = _turn(body, cfg)
    nxt = dict(body, messages=[*body["messages"], msg, {"role": "user", "content": "and tomorrow?"}])
    assert simple_tokenize_prompt(nxt)[: len(prompt) + len(gen)] == prompt + gen


def test_reasoning_field_spelling_and_null_content_render_the_same() -> None:
    a = {"role": "assistant", "content": None, "reasoning": "let me think"}
    b = {"role": "assistant", "content": "", "reasoning_content": "let me think"}
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert simple_tokenize_generated(body, a) == simple_tokenize_generated(body, b)


def test_effort_change_moves_token_two() -> None:
    m = [{"role": "user", "content": "hello there"}]
    a = simple_tokenize_prompt({"messages": m, "reasoning_effort": "high"})
    b = simple_tokenize_prompt({"messages": m, "reasoning_effort": "max"})
    assert a[:2] == b[:2] and a[2] != b[2]


def test_tool_arguments_follow_required_properties() -> None:
    body = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS}
    plan = plan_chat(body, 7, EmulatorConfig())
    assert plan.tool_call is not None and plan.finish_reason == "tool_calls"
    args = json.loads(plan.tool_call.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] == "celsius"
    assert "".join(plan.tool_call.fragments) == plan.tool_call.arguments


@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_cache_repeat_and_extension(block_size: int) -> None:
    cache = PrefixCache(block_size, 1_000_000)
    prompt = list(range(1000, 1100))
    data = token_bytes(prompt)
    hashes = cache.hashes(data)
    assert cache.match(data, hashes) == 0
    cache.insert(data, hashes)
    assert cache.cached_tokens(cache.match(data, hashes), len(prompt)) == (len(prompt) - 1) // block_size * block_size
    full = prompt + list(range(5000, 5013))
    fdata = token_bytes(full)
    cache.insert(fdata, cache.hashes(fdata, known=hashes))
    nxt = full + list(range(7000, 7020))
    ndata = token_bytes(nxt)
    assert cache.match(ndata, cache.hashes(ndata)) == len(full) // block_size * block_size


def test_cache_salt_isolates() -> None:
    cache = PrefixCache(16, 1000)
    data = token_bytes(list(range(64)))
    cache.insert(data, cache.hashes(data, 0), 0)
    assert cache.match(data, cache.hashes(data, 0), 0) == 64
    assert cache.match(data, cache.hashes(data, 99), 99) == 0


def test_cache_evicts_lru_tail_first() -> None:
    cache = PrefixCache(16, 8)  # 128 tokens
    a = token_bytes(list(range(0, 96)))  # 6 blocks
    b = token_bytes(list(range(1000, 1064)))  # 4 blocks
    cache.insert(a, cache.hashes(a))
    cache.insert(b, cache.hashes(b))
    assert cache.used_blocks == 8 and cache.evictions == 2
    # A lost its tail, not its head: a shorter prefix still hits.
    assert cache.match(a, cache.hashes(a)) == 64
    assert cache.match(b, cache.hashes(b)) == 64


def test_fine_cache_does_not_double_count_partial_tails() -> None:
    cache = PrefixCache(1, 1000)
    short = token_bytes(list(range(10)))
    cache.insert(short, cache.hashes(short))
    longer = token_bytes(list(range(14)))
    cache.insert(longer, cache.hashes(longer))
    assert cache.used_blocks == 14
    assert cache.match(longer, cache.hashes(longer)) == 14


def test_config_merge_validates() -> None:
    cfg = EmulatorConfig()
    assert cfg.merged({"flavour": "sglang"}).eff_block_size == 1
    assert cfg.eff_block_size == 16 and cfg.eff_reasoning_field == "reasoning"
    with pytest.raises(ValueError):
        cfg.merged({"nope": 1})
    with pytest.raises(ValueError):
        cfg.merged({"fail_rate": 2})
    assert cfg.merged({"empty_output_prompts": ["a", "b"]}).empty_output_prompts == ("a", "b")


def test_cli_flags_and_config_json() -> None:
    from gateway.emulator.cli import config_from_args

    cfg, host, port = config_from_args(
        ["--", "--port", "9001", "--flavour", "sglang", "--decode-tps", "200", "--empty-output-prompts", "a",
         "--empty-output-prompts", "b", "--no-cache-report", "--config-json", '{"seed": 3, "decode_tps": 5}']
    )
    assert (host, port) == ("127.0.0.1", 9001)
    assert cfg.flavour == "sglang" and cfg.decode_tps == 200.0 and cfg.seed == 3  # flags win over the JSON
    assert cfg.empty_output_prompts == ("a", "b") and cfg.cache_report is False


async def test_injected_tokenizer_drives_the_cache() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from gateway.emulator import Emulator

    def by_char(body: dict) -> list[int]:
        return [ord(c) for m in body["messages"] for c in (m.get("content") or "")]

    def gen_chars(body: dict, message: dict) -> list[int]:
        return [ord(c) for c in (message.get("content") or "")]

    emu = Emulator(EmulatorConfig(flavour="sglang"), tokenize_prompt=by_char, tokenize_generated=gen_chars)
    async with TestClient(TestServer(emu.app(), host="127.0.0.1")) as client:
        body = {"messages": [{"role": "user", "content": "abcdefgh"}], "max_tokens": 3}
        first = await (await client.post("/v1/chat/completions", json=body)).json()
        assert first["usage"]["prompt_tokens"] == 8
        reply = first["choices"][0]["message"]["content"]
        body["messages"] += [{"role": "assistant", "content": reply}, {"role": "user", "content": "xy"}]
        second = await (await client.post("/v1/chat/completions", json=body)).json()
        # the prompt and the reply, but for the reply's last token (sampled, never fed back: no KV)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 8 + len(reply) - 1


# -- playing an agent's model ---------------------------------------------------------------------------

SHELLS = [
    ("exec_command", {"cmd": {"type": "string"}}, "echo ok"),  # Codex
    ("Bash", {"command": {"type": "string"}, "description": {"type": "string"}}, "echo ok"),  # Claude Code
    ("run_shell_command", {"command": {"type": "string"}}, "echo ok"),  # Qwen Code
    ("shell", {"command": {"type": "array", "items": {"type": "string"}}}, ["echo", "ok"]),  # an argv tool
]


@pytest.mark.parametrize("name, props, expected", SHELLS)
def test_the_agent_model_runs_a_harmless_command_then_answers(name: str, props: dict, expected) -> None:
    cfg = EmulatorConfig(agent_tool_turns=2, answer_tokens=40)
    other = {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}
    shell = {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}
    messages = [{"role": "user", "content": "list the files"}]
    for _ in range(2):
        plan = plan_chat({"messages": messages, "tools": [other, shell]}, 1, cfg)
        assert plan.finish_reason == "tool_calls" and plan.tool_call is not None
        assert plan.tool_call.name == name
        assert list(json.loads(plan.tool_call.arguments).values()) == [expected]
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": name, "arguments": plan.tool_call.arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}]
    plan = plan_chat({"messages": messages, "tools": [other, shell], "max_tokens": 64000}, 1, cfg)
    assert plan.tool_call is None and plan.finish_reason == "stop" and 10 <= len(plan.content) <= 40
    # A new user message starts the next round of commands.
    messages += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "again"}]
    assert plan_chat({"messages": messages, "tools": [shell]}, 1, cfg).tool_call is not None


def test_plausible_answers_stop_unless_the_budget_is_smaller() -> None:
    cfg = EmulatorConfig(answer_tokens=100)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    lengths = {len(plan_chat({**body, "seed": s}, s, cfg).content) for s in range(20)}
    assert min(lengths) >= 25 and max(lengths) <= 100 and len(lengths) > 3
    assert plan_chat({**body, "max_tokens": 64000}, 1, cfg).finish_reason == "stop"
    short = plan_chat({**body, "max_tokens": 5}, 1, cfg)
    assert len(short.content) == 5 and short.finish_reason == "length"


def test_an_answer_cut_at_max_tokens_holds_what_the_engine_reports_sampled_less_one():
    """The engine holds prompt + completion_tokens - 1 of an answer cut at max_tokens, whatever count its
    text renders to in the next turn (the gateway predicts from the reported count)."""
    from gateway.emulator.job import computed

    gen = list(range(27))  # the answer as the next turn renders it: its text, then an end token never sampled
    assert computed(gen, True, sampled=24) == gen[:23]
    assert computed(gen[:20], True, sampled=24) == gen[:19]  # a text shorter than what was sampled
    assert computed(gen, True) == gen[:25]
    assert computed(gen, False, sampled=24) == gen[:26]  # a finished answer: its end token was sampled
