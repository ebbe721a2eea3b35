"""Property-based: generated chat requests, valid and invalid, through the real gateway's HTTP API.

Whatever arrives, the gateway answers: never a 5xx, every 4xx in OpenAI's error shape, nothing hangs
(every call has a client timeout), a stream always ends with [DONE], and on lanes whose limits match the
engine's, the engine never has to refuse what the gateway should have refused (images, top_logprobs,
placeholder tokens, the context window).
"""

from __future__ import annotations

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.emulator_proc import LIMITED_EMULATOR
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane as base_lane
from tests.support.routes import routes

PH = "<｜deepseek_image｜>"
WINDOW = LIMITED_EMULATOR["max_model_len"]
LIMITS = {"max_images": 4, "max_top_logprobs": 32, "max_context_tokens": WINDOW, "placeholder_tokens": [PH],
          "max_messages": 12, "max_request_bytes": 200_000}
ENGINE_REFUSALS = ("At most 4 image", "Requested sample logprobs", "deepseek_image", "maximum context length")
LIMIT_CODES = {"too_many_images", "top_logprobs_too_large", "invalid_placeholder_token", "context_length_exceeded",
               "too_many_messages", "request_too_large"}


def lane(url: str, **extra) -> dict:
    return base_lane(url, timeouts={"connect": 2, "first_byte": 20, "idle": 10}, **extra)


@pytest.fixture(scope="module")
def gw(limited_emu):
    lanes = {
        "strict": lane(limited_emu.url, limits=LIMITS),
        "lenient": lane(limited_emu.url, limits={**LIMITS, "images_policy": "drop_oldest",
                                                 "top_logprobs_policy": "clamp", "placeholder_policy": "escape"}),
        "notemplate": lane(limited_emu.url, limits=LIMITS, render={"template": None}),
        "nolimits": lane(limited_emu.url),
    }
    with run_gateway(routes(lanes)) as g:
        yield g


@pytest.fixture(scope="module")
def http(gw):
    with httpx.Client(base_url=gw.base_url, timeout=httpx.Timeout(20.0)) as c:
        yield c


# -- strategies ------------------------------------------------------------------------------------------------
# Mostly well-formed requests (so the limits, not the shape checks, decide), some malformed ones, some junk.

plain_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
special_text = st.sampled_from([PH, f"see {PH}!", f"{PH}{PH}", "<|image_pad|>", "", "x" * 500, "y " * 400])
text = st.one_of(*([plain_text] * 14), special_text)
image_part = st.one_of(
    st.builds(lambda k: {"type": "image_url", "image_url": {"url": f"data:image/png;base64,AAAA{k}"}},
              st.integers(0, 99)),
    st.just({"type": "image_url", "image_url": "data:image/png;base64,BBBB"}),
    st.just({"type": "image", "source": {"data": "QUFB"}}),
    st.just({"type": "input_image", "image_url": "data:image/png;base64,CCCC"}),
)
text_part = st.builds(lambda t: {"type": "text", "text": t}, text)
good_part = st.one_of(text_part, image_part)
good_call = st.builds(
    lambda a: {"id": "c1", "type": "function", "function": {"name": "f", "arguments": a}},
    st.one_of(st.just("{}"), st.builds(lambda t: orjson.dumps({"q": t}).decode(), text), st.just({"q": PH})))
good_message = st.one_of(
    st.fixed_dictionaries({"role": st.just("system"), "content": text}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(text, st.lists(good_part, min_size=1,
                                                                                         max_size=4))}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(image_part, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": text},
                          optional={"reasoning_content": text, "tool_calls": st.lists(good_call, min_size=1,
                                                                                       max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.just("c1"),
                           "content": st.one_of(text, st.lists(good_part, min_size=1, max_size=3))}),
)
good_tools = st.sampled_from([
    [{"type": "function", "function": {"name": "f", "description": f"about {PH}", "parameters": {}}}],
    [{"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}],
])


@st.composite
def good_body(draw) -> dict:
    body = {"model": draw(st.sampled_from(["strict", "lenient", "notemplate", "nolimits"])),
            "messages": draw(st.lists(good_message, min_size=1, max_size=14))}
    if draw(st.booleans()):
        body[draw(st.sampled_from(["max_tokens", "max_completion_tokens"]))] = draw(
            st.sampled_from([1, 4, 16, 3000, 4090, 4095, 5000, 10**6]))
    else:
        body["max_tokens"] = draw(st.sampled_from([1, 4, 16]))
    if draw(st.booleans()):
        body["logprobs"] = draw(st.booleans())
        if draw(st.booleans()):
            body["top_logprobs"] = draw(st.integers(-2, 60))
    if draw(st.booleans()):
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    if draw(st.integers(0, 3)) == 0:
        body["tools"] = draw(good_tools)
    if draw(st.integers(0, 3)) == 0:
        body["reasoning_effort"] = draw(st.sampled_from(["high", "max"]))
    return body


bad_part = st.one_of(good_part, st.sampled_from([{"type": "text"}, {"type": "bogus"}, {"type": 3}, {}, 7, None,
                                                 {"type": "image_url"}]))
bad_content = st.one_of(text, st.lists(bad_part, max_size=5), st.none(), st.integers(-9, 9), st.just({"a": 1}))
bad_call = st.one_of(good_call, st.sampled_from([{"id": "c1"}, "call", None,
                                                 {"function": {"name": "f", "arguments": "not json"}}]))
bad_message = st.one_of(
    good_message,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "bogus", 1]),
         "content": bad_content},
        optional={"reasoning_content": st.one_of(text, st.integers(-9, 9)),
                  "tool_calls": st.lists(bad_call, max_size=2), "tool_call_id": st.just("c1")}),
    st.sampled_from(["hi", 3, None, []]),
)
bad_body = st.fixed_dictionaries(
    {"model": st.sampled_from(["strict", "lenient", "notemplate", "nolimits", "missing", 5]),
     "messages": st.one_of(st.lists(bad_message, max_size=14), st.just("nope"), st.none())},
    optional={
        "max_tokens": st.sampled_from([-1, 0, 1, 3, 4090, 5000, 10**9, "8", None, 2.5]),
        "max_completion_tokens": st.sampled_from([1, 4095, 10**6, None, "x"]),
        "logprobs": st.one_of(st.booleans(), st.sampled_from([1, "yes", None])),
        "top_logprobs": st.one_of(st.integers(-3, 60), st.sampled_from([None, "5", True])),
        "stream": st.sampled_from([True, False, "yes"]),
        "stream_options": st.sampled_from([{"include_usage": True}, None, "x"]),
        "tools": st.one_of(good_tools, st.sampled_from(["tools", [1], [{"function": {}}]])),
        "reasoning_effort": st.sampled_from(["high", "max", "low", "bogus", 7, None, True]),
    },
)
raw_body = st.one_of(
    st.builds(orjson.dumps, good_body()),
    st.builds(orjson.dumps, good_body()),
    st.builds(orjson.dumps, good_body()),
    st.builds(orjson.dumps, bad_body),
    st.sampled_from([b"", b"{", b"[]", b"null", b'"x"', b'{"model": "strict"}', b"\xff\xfe",
                     b'{"model": "strict", "messages": [{"role": "user", "content": "\\ud800"}]}']),
)


def check_error_shape(r: httpx.Response) -> dict:
    assert r.headers.get("content-type", "").startswith("application/json"), r.text[:300]
    body = r.json()
    assert list(body) == ["error"], body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] is None or isinstance(err["code"], str), err
    return err


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(raw=raw_body)
def test_any_request_gets_a_sane_answer(http, raw):
    try:
        sent = orjson.loads(raw)
    except orjson.JSONDecodeError:
        sent = None
    streaming = isinstance(sent, dict) and sent.get("stream") is True
    with http.stream("POST", "/chat/completions", content=raw, headers={"Content-Type": "application/json"}) as r:
        data = r.read()  # bounded by the client timeout: a hang fails the test
    assert r.status_code < 500, (r.status_code, data[:500])
    if r.status_code >= 400:
        err = check_error_shape(r)
        model = sent.get("model") if isinstance(sent, dict) else None
        event(f"{model}: {r.status_code} {err['code'] or 'engine said: ' + err['message'][:40]}")
        model = sent.get("model") if isinstance(sent, dict) else None
        if model in ("strict", "lenient") or (model == "notemplate" and err["code"] != "context_length_exceeded"):
            # The gateway refuses first: the engine never has to say these.
            assert not any(s in err["message"] for s in ENGINE_REFUSALS) or err["code"] in LIMIT_CODES, err
        if model == "lenient":
            assert err["code"] not in ("too_many_images", "top_logprobs_too_large", "invalid_placeholder_token"), err
        if model == "nolimits":
            assert err["code"] not in LIMIT_CODES, err
        return
    assert r.status_code == 200
    event(f"200 {r.headers.get('x-gateway-limits', '').split(' ')[0] or 'as sent'}")
    if streaming:
        assert data.rstrip().endswith(b"data: [DONE]"), data[-300:]
    else:
        assert orjson.loads(data)["choices"]


def test_gateway_logged_no_limit_failures(gw):
    log = gw.log()
    assert "limits check failed" not in log and "gateway/limits/" not in log, log[-5000:]
