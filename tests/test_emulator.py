"""The upstream emulator as a real process on loopback: shapes, prefix cache, faults, cancellation, pacing."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.support.emulator_proc import EmulatorProc, run_emulator
from tests.support.poll import until

MODEL = "deepseek-v4-flash"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@pytest.fixture(scope="module")
def vllm() -> Iterator[EmulatorProc]:
    with run_emulator(flavour="vllm", model=MODEL) as emu:
        yield emu


@pytest.fixture(scope="module")
def sglang() -> Iterator[EmulatorProc]:
    with run_emulator(flavour="sglang", model=MODEL) as emu:
        yield emu


@pytest.fixture(params=["vllm", "sglang"])
def emu(request: pytest.FixtureRequest) -> EmulatorProc:
    proc: EmulatorProc = request.getfixturevalue(request.param)
    proc.reset(config=True)
    return proc


def client(emu: EmulatorProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.base_url, api_key="unused", max_retries=0, timeout=20)


def flavour(emu: EmulatorProc) -> str:
    return json.loads(_get(emu.url + "/emulator/config"))["flavour"]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback
        return r.read().decode()


def chat_body(text: str = "What is the weather in Paris?", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "system", "content": "You are terse."},
                                                         {"role": "user", "content": text}]}
    body.update(extra)
    return body


async def sse(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
    """Every SSE data payload, JSON-decoded ("[DONE]" kept as a string)."""
    out: list[Any] = []
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=body, headers=headers or {}) as r:
            assert r.status == 200, await r.text()
            async for line in r.content:
                if line.startswith(b"data: "):
                    payload = line[6:].strip()
                    out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


async def post(url: str, body: Any, headers: dict[str, str] | None = None,
               path: str = "/v1/chat/completions") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + path, json=body, headers=headers or {}) as r:
            return r.status, await r.json(content_type=None)


def cfg_header(**knobs: Any) -> dict[str, str]:
    return {"X-Emulator-Config": json.dumps(knobs)}


# -- shapes ----------------------------------------------------------------------------------------
def test_models(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    data = json.loads(_get(emu.url + "/v1/models"))
    card = data["data"][0]
    assert data["object"] == "list" and card["id"] == MODEL and card["max_model_len"] == 65536
    assert card["owned_by"] == fl
    assert ("permission" in card) == (fl == "vllm")
    assert [m.id for m in client(emu).models.list()] == [MODEL]


def test_nonstream_chat_openai_client(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    resp = client(emu).chat.completions.create(model=MODEL, messages=chat_body()["messages"], max_tokens=5)
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert len(choice.message.content.split()) == 5
    assert resp.usage.completion_tokens == 5
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 5
    raw = resp.model_dump()
    if fl == "vllm":
        assert raw["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert raw["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
        assert raw["kv_transfer_params"] is None and raw["choices"][0]["stop_reason"] is None
    else:
        assert raw["usage"]["prompt_tokens_details"] is None  # SGLang: null unless something was cached
        assert raw["usage"]["reasoning_tokens"] == 0
        assert raw["metadata"] == {"weight_version": "default"}


async def test_stream_thinking_shapes(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    body = chat_body(stream=True, stream_options={"include_usage": True}, max_tokens=12,  # 8 reasoning + 4
                     chat_template_kwargs={"thinking": True})
    events = await sse(emu.url, body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    role, usage_chunk, finish = chunks[0], chunks[-1], chunks[-2]
    rfield = "reasoning" if fl == "vllm" else "reasoning_content"
    assert role["choices"][0]["delta"]["role"] == "assistant"
    reasoning = [c for c in chunks[1:-2] if c["choices"][0]["delta"].get(rfield)]
    content = [c for c in chunks[1:-2] if c["choices"][0]["delta"].get("content")]
    assert len(reasoning) == 8 and len(content) == 4
    assert chunks[1:-2] == reasoning + content  # reasoning first, one chunk per token
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == []
    u = usage_chunk["usage"]
    assert u["completion_tokens"] == 12 and u["total_tokens"] == u["prompt_tokens"] + 12
    if fl == "vllm":
        assert set(role) == {"id", "object", "created", "model", "choices", "prompt_token_ids"}
        assert set(content[0]["choices"][0]) == {"index", "delta", "logprobs", "finish_reason", "token_ids"}
        assert set(content[0]) == {"id", "object", "created", "model", "choices"}  # no usage key (exclude_unset)
        assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["stop_reason"] is None
        assert u["completion_tokens_details"] == {"reasoning_tokens": 8}
        assert u["prompt_tokens_details"] == {"cached_tokens": 0}
    else:
        assert role["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
        assert content[0]["usage"] is None
        delta = content[0]["choices"][0]["delta"]
        assert delta == {"role": None, "content": delta["content"], "reasoning_content": None, "tool_calls": None}
        assert "usage" not in reasoning[0]
        assert finish["choices"][0]["matched_stop"] is None
        assert u["reasoning_tokens"] == 8 and u["prompt_tokens_details"] is None


async def test_stream_without_include_usage_has_no_usage_chunk(emu: EmulatorProc) -> None:
    events = await sse(emu.url, chat_body(stream=True))
    assert all(e == "[DONE]" or e["choices"] for e in events)
    assert len(events) == 1 + 16 + 1 + 1  # role, default 16 tokens, finish, [DONE]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_reasoning_effort_and_openai_stream(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    stream = client(emu).chat.completions.create(
        model=MODEL, messages=chat_body()["messages"], stream=True, stream_options={"include_usage": True},
        reasoning_effort="high", max_tokens=11,  # max_tokens counts reasoning (8) too
    )
    reasoning, content, usage = "", "", None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            extra = ch.delta.model_extra or {}
            reasoning += extra.get("reasoning") or extra.get("reasoning_content") or ""
            content += ch.delta.content or ""
    assert len(reasoning.split()) == 8 and len(content.split()) == 3
    assert usage is not None and usage.completion_tokens == 11
    reported = (usage.completion_tokens_details.reasoning_tokens if fl == "vllm"
                else usage.model_extra["reasoning_tokens"])
    assert reported == 8


async def test_tool_call_stream_and_nonstream(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    body = chat_body(tools=[WEATHER_TOOL], max_tokens=2, stream=True, stream_options={"include_usage": True})
    events = await sse(emu.url, body)
    tool_chunks = [e for e in events[:-1] if e["choices"] and e["choices"][0]["delta"].get("tool_calls")]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in tool_chunks]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["function"]["arguments"] == ""
    assert calls[0]["id"].startswith("call_") and len(calls[0]["id"]) == 5 + 24
    args = "".join(c["function"]["arguments"] for c in calls)
    parsed = json.loads(args)
    assert set(parsed) == {"city", "unit"} and parsed["unit"] == "celsius"
    if fl == "vllm":
        assert len(calls) == 1 + 2 + 2  # header, "{", two pairs, "}"
        assert calls[1] == {"index": 0, "function": {"arguments": "{"}}
    else:
        assert len(calls) == 2 and calls[1]["id"] is None and calls[1]["function"]["name"] is None
    finish = events[-3]
    assert finish["choices"][0]["finish_reason"] == "tool_calls"

    resp = client(emu).chat.completions.create(model=MODEL, messages=body["messages"], tools=[WEATHER_TOOL],
                                               max_tokens=2)
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert json.loads(msg.tool_calls[0].function.arguments) == parsed  # same prompt, same output
    assert msg.tool_calls[0].id.startswith("chatcmpl-tool-" if fl == "vllm" else "call_")


async def test_tool_result_turn_answers_with_content(emu: EmulatorProc) -> None:
    body = chat_body(tools=[WEATHER_TOOL])
    body["messages"] += [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C sunny"},
    ]
    status, out = await post(emu.url, body)
    assert status == 200 and out["choices"][0]["finish_reason"] == "stop"
    assert not out["choices"][0]["message"]["tool_calls"]


async def test_completions_endpoint(emu: EmulatorProc) -> None:
    status, out = await post(emu.url, {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6},
                             path="/v1/completions")
    assert status == 200 and out["object"] == "text_completion"
    assert len(out["choices"][0]["text"].split()) == 6 and out["usage"]["completion_tokens"] == 6
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/completions",
                          json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6,
                                "stream": True, "stream_options": {"include_usage": True}}) as r:
            lines = [ln async for ln in r.content if ln.startswith(b"data: ")]
    assert lines[-1].strip() == b"data: [DONE]"
    text = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in lines[:-3])
    assert text == out["choices"][0]["text"]  # deterministic
    # prompt + completion re-sent: cached covers both, but for the last token sampled, which the engine
    # never computed KV for (vLLM and SGLang alike)
    status, nxt = await post(emu.url, {"model": MODEL, "prompt": "Once upon a time" + text + " then", "max_tokens": 1},
                             path="/v1/completions")
    held = out["usage"]["prompt_tokens"] + 6 - 1
    bs = 16 if flavour(emu) == "vllm" else 1
    assert nxt["usage"]["prompt_tokens_details"]["cached_tokens"] == held // bs * bs


async def test_request_id_header_is_echoed_and_recorded(emu: EmulatorProc) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", json=chat_body(), headers={"X-Request-Id": "req-abc"}) as r:
            out = await r.json()
            assert r.headers["X-Request-Id"] == "req-abc"
    assert out["id"] == ("chatcmpl-req-abc" if flavour(emu) == "vllm" else "req-abc")
    stats = emu.stats()
    assert stats["last_headers"]["x-request-id"] == "req-abc"  # names lowercased
    assert stats["recent"][-1]["request_id"] == "req-abc" and stats["recent"][-1]["body"]["model"] == MODEL


# -- prefix cache ----------------------------------------------------------------------------------
async def _usage_of(emu: EmulatorProc, body: dict[str, Any]) -> dict[str, Any]:
    events = await sse(emu.url, dict(body, stream=True, stream_options={"include_usage": True}))
    return events[-2]["usage"]


def _cached(u: dict[str, Any]) -> int:
    return (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def _bs(emu: EmulatorProc) -> int:
    return 16 if flavour(emu) == "vllm" else 1


async def test_repeat_request_hits_block_aligned_prompt_minus_one(emu: EmulatorProc) -> None:
    body = chat_body(" ".join(f"word{i}" for i in range(90)), max_tokens=4)
    first = await _usage_of(emu, body)
    assert _cached(first) == 0
    second = await _usage_of(emu, body)
    n = second["prompt_tokens"]
    assert _cached(second) == (n - 1) // _bs(emu) * _bs(emu)


async def _tokens(emu: EmulatorProc, body: dict[str, Any]) -> list[int]:
    status, out = await post(emu.url, body, path="/tokenize")
    assert status == 200
    return out["tokens"]


@pytest.mark.parametrize("tools", [False, True])
async def test_append_only_turn_covers_previous_prompt_and_output(emu: EmulatorProc, tools: bool) -> None:
    extra: dict[str, Any] = {"chat_template_kwargs": {"thinking": True}, "max_tokens": 15}  # 8 reasoning + 7
    if tools:
        extra["tools"] = [WEATHER_TOOL]
    body = chat_body(" ".join(f"w{i}" for i in range(60)), **extra)
    events = await sse(emu.url, dict(body, stream=True, stream_options={"include_usage": True}))
    reasoning = content = ""
    calls: dict[int, dict[str, Any]] = {}
    for e in events[:-1]:
        for ch in e["choices"]:
            d = ch["delta"]
            reasoning += d.get("reasoning") or d.get("reasoning_content") or ""
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or ():
                slot = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                slot["function"]["name"] += (tc.get("function") or {}).get("name") or ""
                slot["function"]["arguments"] += (tc.get("function") or {}).get("arguments") or ""
    assistant: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    follow: dict[str, Any]
    if calls:
        assistant["tool_calls"] = list(calls.values())
        follow = {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18C and sunny"}
    else:
        follow = {"role": "user", "content": "And tomorrow?"}
    prev_prompt = events[-2]["usage"]["prompt_tokens"]
    nxt = dict(body, messages=[*body["messages"], assistant, follow])

    prev_tokens = await _tokens(emu, body)
    with_output = await _tokens(emu, dict(body, messages=[*body["messages"], assistant]))
    new_tokens = await _tokens(emu, nxt)
    covered = len(with_output) - 1  # minus the trailing generation prompt
    assert new_tokens[:covered] == with_output[:covered] and with_output[: len(prev_tokens) - 1] == prev_tokens[:-1]
    assert covered > prev_prompt  # the generated output counts

    u = await _usage_of(emu, nxt)
    bs = _bs(emu)
    # The last token sampled is never fed back: no KV for it. Cut at max_tokens, the engine holds the prompt
    # and the completion tokens it reports less that last one (never the end token the next turn closes the
    # message with), whatever count the text renders to.
    cut = next(ch["finish_reason"] for e in events[:-1] for ch in e["choices"] if ch.get("finish_reason")) == "length"
    sampled = events[-2]["usage"]["completion_tokens"]
    held = min(covered - 1, prev_prompt + sampled - 1) if cut else covered - 1
    assert _cached(u) == min(held, u["prompt_tokens"] - 1) // bs * bs
    assert _cached(u) > prev_prompt


async def test_an_answer_cut_at_max_tokens_holds_prompt_plus_completion_minus_one(emu: EmulatorProc) -> None:
    """Cut at max_tokens, the answer has no end token: the engine computed every generated token but the
    last sampled one, however the next turn closes the message. Cut where prompt + output fills whole
    blocks, the next turn finds one block less than its common prefix with them."""
    bs = _bs(emu)
    body = chat_body(" ".join(f"c{i}" for i in range(70)), chat_template_kwargs={"thinking": False})
    prompt = len(await _tokens(emu, body))
    body["max_tokens"] = bs - prompt % bs + 2 * bs if bs > 1 else 12
    events = await sse(emu.url, dict(body, stream=True, stream_options={"include_usage": True}))
    content = "".join(ch["delta"].get("content") or "" for e in events[:-2] for ch in e["choices"])
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    usage = events[-2]["usage"]
    assert usage["prompt_tokens"] == prompt and (prompt + usage["completion_tokens"]) % bs == 0
    nxt = dict(body, messages=[*body["messages"], {"role": "assistant", "content": content},
                               {"role": "user", "content": "Go on."}])
    u = await _usage_of(emu, nxt)
    assert _cached(u) == (prompt + usage["completion_tokens"] - 1) // bs * bs


async def test_edit_in_history_moves_the_prefix(emu: EmulatorProc) -> None:
    long = " ".join(f"t{i}" for i in range(200))
    await _usage_of(emu, chat_body(long, max_tokens=2))
    edited = chat_body(long, max_tokens=2)
    edited["messages"][0]["content"] = "You are terse. Today is Tuesday."
    assert _cached(await _usage_of(emu, edited)) < 16


async def test_small_pool_evicts(emu: EmulatorProc) -> None:
    bs = _bs(emu)
    emu.configure(cache_blocks=160 // bs)  # room for ~160 tokens
    a = chat_body(" ".join(f"a{i}" for i in range(120)), max_tokens=2)
    b = chat_body(" ".join(f"b{i}" for i in range(120)), max_tokens=2)
    await _usage_of(emu, a)
    full_hit = _cached(await _usage_of(emu, a))
    await _usage_of(emu, b)
    after = _cached(await _usage_of(emu, a))
    stats = emu.stats()
    assert stats["evictions"] > 0 and stats["cache"]["blocks_used"] <= 160 // bs
    assert after < full_hit


async def test_cache_report_off(emu: EmulatorProc) -> None:
    u = await _usage_of(emu, chat_body())
    emu.configure(cache_report=False)
    u = await _usage_of(emu, chat_body())
    if flavour(emu) == "vllm":
        assert "prompt_tokens_details" not in u
    else:
        assert u["prompt_tokens_details"] is None


# -- determinism -----------------------------------------------------------------------------------
async def _text(emu: EmulatorProc, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    status, out = await post(emu.url, body, headers)
    assert status == 200, out
    return out["choices"][0]["message"]["content"]


async def test_determinism_seed_salt_temperature(emu: EmulatorProc) -> None:
    base = chat_body(max_tokens=12)
    a = await _text(emu, base)
    assert a == await _text(emu, base)
    assert a == await _text(emu, dict(base, temperature=0))
    assert a != await _text(emu, base, cfg_header(output_salt="x"))
    assert await _text(emu, base, cfg_header(output_salt="x")) == await _text(emu, base, cfg_header(output_salt="x"))
    assert a != await _text(emu, dict(base, seed=7))
    hot_seeded = dict(base, seed=7, temperature=1.0)
    assert await _text(emu, hot_seeded) == await _text(emu, hot_seeded)
    hot = {await _text(emu, dict(base, temperature=1.0)) for _ in range(3)}
    assert len(hot) == 3


async def test_empty_output_prompts_and_ignore_eos(emu: EmulatorProc) -> None:
    emu.configure(empty_output_prompts=["SAY NOTHING"])
    status, out = await post(emu.url, chat_body("please SAY NOTHING now", max_tokens=5))
    assert status == 200 and out["choices"][0]["message"]["content"] == ""
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == 0
    events = await sse(emu.url, chat_body("please SAY NOTHING now", stream=True))
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-2]] == []
    status, out = await post(emu.url, chat_body("please SAY NOTHING now", max_tokens=5, ignore_eos=True))
    assert len(out["choices"][0]["message"]["content"].split()) == 5


# -- faults ----------------------------------------------------------------------------------------
async def test_fail_rate(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    status, out = await post(emu.url, chat_body(), cfg_header(fail_rate=1.0))
    assert status == 500
    err = out["error"] if fl == "vllm" else out
    assert err["code"] == 500 and err["type"] == "InternalServerError"
    assert ("object" in out) == (fl == "sglang")

    async def pattern() -> list[int]:
        emu.reset(config=True)
        emu.configure(fail_rate=0.5)
        return [(await post(emu.url, chat_body()))[0] for _ in range(16)]

    first = await pattern()
    assert set(first) == {200, 500}
    assert await pattern() == first  # seeded RNG: same sequence after a reset


async def test_die_after_chunks(emu: EmulatorProc) -> None:
    got: list[bytes] = []
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", json=chat_body(stream=True),
                          headers=cfg_header(die_after_chunks=3)) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for line in r.content:
                    if line.startswith(b"data: "):
                        got.append(line)
    assert len(got) == 3 and all(b"[DONE]" not in g for g in got)
    with pytest.raises(openai.APIError):
        client(emu).chat.completions.create(model=MODEL, messages=chat_body()["messages"],
                                            extra_headers=cfg_header(die_after_chunks=0))
    assert emu.stats()["cancelled_count"] == 0  # our own cut is not a client cancellation


async def test_error_after_chunks(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    events = await sse(emu.url, chat_body(stream=True), cfg_header(error_after_chunks=2))
    assert len(events) == 4 and events[-1] == "[DONE]"
    err = events[2]["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert ("object" in err) == (fl == "sglang")


async def test_stall_before_first_byte(emu: EmulatorProc) -> None:
    t = time.monotonic()
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", json=chat_body(stream=True),
                          headers=cfg_header(stall_before_first_byte_s=0.5)) as r:
            headers_at = time.monotonic() - t
            await r.read()
    assert headers_at >= 0.5


async def test_stall_mid_stream(emu: EmulatorProc) -> None:
    stamps: list[float] = []
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", json=chat_body(stream=True),
                          headers=cfg_header(stall_after_chunks=3, stall_s=0.4)) as r:
            async for line in r.content:
                if line.startswith(b"data: "):
                    stamps.append(time.monotonic())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert gaps[2] >= 0.39 and max(gaps[:2] + gaps[3:]) < 0.1


async def test_image_limit(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    emu.configure(max_images=4)
    msgs = [{"role": "user", "content": [{"type": "text", "text": f"img {i}"}, IMAGE]} for i in range(3)]
    msgs.insert(1, {"role": "assistant", "content": "ok"})
    status, _ = await post(emu.url, {"model": MODEL, "messages": msgs})
    assert status == 200
    msgs[-1] = {"role": "user", "content": [IMAGE, IMAGE, IMAGE]}
    status, out = await post(emu.url, {"model": MODEL, "messages": msgs})
    assert status == 400
    if fl == "vllm":
        assert out["error"]["message"] == ("At most 4 image(s) may be provided in one prompt. "
                                           "Set `--limit-mm-per-prompt` to increase this limit. (parameter=image)")
        assert out["error"]["param"] == "image" and out["error"]["code"] == 400
    else:
        assert out == {"object": "error", "message": "Image count 5 exceeds limit 4 per request.",
                       "type": "BadRequestError", "param": None, "code": 400}


async def test_top_logprobs_limit(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    ok, _ = await post(emu.url, chat_body(logprobs=True, top_logprobs=20))
    assert ok == 200
    if fl == "vllm":
        status, out = await post(emu.url, chat_body(logprobs=True, top_logprobs=21))
        assert status == 400 and out["error"]["message"] == (
            "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)")
    else:
        status, out = await post(emu.url, chat_body(logprobs=True, top_logprobs=200000))
        assert status == 400 and out["message"] == "top_logprobs_num must be in [0, 129280], got 200000"
    status, _ = await post(emu.url, chat_body(logprobs=True, top_logprobs=5), cfg_header(max_top_logprobs=4))
    assert status == 400


async def test_context_length(emu: EmulatorProc) -> None:
    fl = flavour(emu)
    emu.configure(max_model_len=40)
    status, out = await post(emu.url, chat_body(" ".join(["x"] * 50)))
    assert status == 400
    msg = out["error"]["message"] if fl == "vllm" else out["message"]
    assert ("maximum context length is 40" in msg if fl == "vllm"
            else "longer than the model's context length (40" in msg)
    status, out = await post(emu.url, chat_body("short", max_tokens=100))
    assert status == 400
    if fl == "vllm":
        assert out["error"]["param"] == "max_tokens"
    else:
        assert out["message"].startswith("Requested token count exceeds the model's maximum context length of 40")


async def test_vllm_rejects_stream_options_without_stream(vllm: EmulatorProc) -> None:
    vllm.reset()
    status, out = await post(vllm.url, chat_body(stream_options={"include_usage": True}))
    assert status == 400 and out["error"]["type"] == "Bad Request"
    assert "Stream options can only be defined when `stream=True`." in out["error"]["message"]


async def test_malformed_body(emu: EmulatorProc) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", data=b"{not json") as r:
            assert r.status == 400
    status, _ = await post(emu.url, {"model": MODEL})
    assert status == 400


async def test_runtime_config_endpoint(emu: EmulatorProc) -> None:
    new = emu.configure(ttft_ms=5, empty_output_prompts=["zz"])
    assert new["ttft_ms"] == 5 and new["empty_output_prompts"] == ["zz"]
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/emulator/config", json={"no_such_knob": 1}) as r:
            assert r.status == 400
    assert emu.reset(config=True)["config"]["ttft_ms"] == 0


# -- cancellation and timing -------------------------------------------------------------------------
async def _abandon(emu: EmulatorProc, body: dict[str, Any], headers: dict[str, str], read_chunks: int,
                   rid: str) -> float:
    """Start a stream, read some chunks, drop the connection; returns the wall time of the drop."""
    headers = dict(headers, **{"X-Request-Id": rid})
    reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
    payload = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
    )
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # response headers
    seen = 0
    while seen < read_chunks:
        line = await reader.readline()
        seen += line.startswith(b"data: ")
    await asyncio.sleep(0.05)  # the scenario: the client stays a moment longer, then drops the connection
    dropped = time.time()
    writer.transport.abort()
    return dropped


async def _wait_cancel(emu: EmulatorProc, rid: str) -> dict[str, Any]:
    return await until(lambda: next((c for c in emu.stats()["cancelled"] if c["request_id"] == rid), None),
                       what=f"the cancel of {rid} recorded", interval=0.02)


async def test_cancel_while_waiting_for_first_token(emu: EmulatorProc) -> None:
    dropped = await _abandon(emu, chat_body(stream=True), cfg_header(ttft_ms=3000), 0, "rid-wait")
    c = await _wait_cancel(emu, "rid-wait")
    assert c["stage"] == "prefill" and 0 <= c["at"] - dropped < 0.1


async def test_cancel_mid_stream(emu: EmulatorProc) -> None:
    body = chat_body(stream=True, max_tokens=200)
    dropped = await _abandon(emu, body, cfg_header(decode_tps=20), 3, "rid-mid")
    c = await _wait_cancel(emu, "rid-mid")
    assert c["stage"] == "decode" and c["chunks_sent"] >= 3 and 0 <= c["at"] - dropped < 0.1
    assert emu.stats()["cancelled_count"] == 1


async def test_ttft_and_prefill(emu: EmulatorProc) -> None:
    body = chat_body(" ".join(f"p{i}" for i in range(200)), stream=True, max_tokens=2)
    t = time.monotonic()
    events: list[float] = []
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", json=body,
                          headers=cfg_header(ttft_ms=100, prefill_tps=1000)) as r:
            async for line in r.content:
                if line.startswith(b"data: "):
                    events.append(time.monotonic() - t)
    assert 0.29 <= events[0] < 0.5  # 100 ms + ~200 uncached tokens at 1000 tok/s
    t = time.monotonic()
    async with aiohttp.ClientSession() as s:  # cached now: only the fixed part remains
        async with s.post(emu.url + "/v1/chat/completions", json=body,
                          headers=cfg_header(ttft_ms=100, prefill_tps=1000)) as r:
            first = None
            async for line in r.content:
                if first is None and line.startswith(b"data: "):
                    first = time.monotonic() - t
    assert first is not None and 0.09 <= first < 0.2


async def test_decode_pacing_within_5_percent(emu: EmulatorProc) -> None:
    n = 201
    stamps: list[float] = []
    body = chat_body(stream=True, max_tokens=n + 8, chat_template_kwargs={"thinking": True})  # + 8 reasoning
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", json=body, headers=cfg_header(decode_tps=200)) as r:
            async for line in r.content:
                if line.startswith(b"data: ") and b'"content":"' in line and b'"content":""' not in line:
                    stamps.append(time.monotonic())
    assert len(stamps) == n
    rate = (n - 1) / (stamps[-1] - stamps[0])
    assert abs(rate - 200) / 200 < 0.05, rate


# -- the real DeepSeek-V4.1 renderer as tokenizer -----------------------------------------------------
async def test_dsv41_tokenizer_append_only_tool_turn() -> None:
    from gateway.emulator.tokens import dsv41_tokenizers

    tokenize_prompt, tokenize_generated = dsv41_tokenizers()
    with run_emulator(flavour="sglang", tokenizer="dsv41") as emu:
        body = chat_body(tools=[WEATHER_TOOL], max_tokens=5, reasoning_effort="high")
        status, out = await post(emu.url, body)
        assert status == 200 and out["choices"][0]["finish_reason"] == "tool_calls"
        msg = out["choices"][0]["message"]
        prev = tokenize_prompt(body)
        assert out["usage"]["prompt_tokens"] == len(prev)
        assistant = {"role": "assistant", "content": msg["content"], "reasoning_content": msg["reasoning_content"],
                     "tool_calls": msg["tool_calls"]}
        gen = tokenize_generated(body, assistant)
        nxt = dict(body, messages=[*body["messages"], assistant,
                                   {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "18C"}])
        assert tokenize_prompt(nxt)[: len(prev) + len(gen)] == prev + gen  # the template keeps reasoning with tools
        status, out2 = await post(emu.url, nxt)
        assert status == 200
        assert out2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prev) + len(gen) - 1  # but the last
