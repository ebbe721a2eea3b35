"""Lane limits through the real gateway and the official openai client, against the emulator configured
with the same limits as the lane: what the gateway refuses never reaches the engine, and what it rewrites
(drop_oldest, clamp, escape) the engine accepts. Each control sends the raw request straight to the
emulator to show that the engine itself would have refused it."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from tests.support.emulator_proc import LIMITED_EMULATOR
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane as base_lane
from tests.support.routes import routes

PH = "<｜deepseek_image｜>"
WINDOW = LIMITED_EMULATOR["max_model_len"]
LIMITS = {"max_images": 4, "max_top_logprobs": 32, "max_context_tokens": WINDOW,
          "placeholder_tokens": [PH], "max_messages": 60, "max_request_bytes": 400_000}


def lane(url: str, **limits) -> dict:
    """A lane with the engine's limits (LIMITS), `limits` added or replaced."""
    return base_lane(url, effort_policy="off", timeouts={"connect": 2, "first_byte": 20, "idle": 10},
                     limits={**LIMITS, **limits})


@pytest.fixture(scope="module")
def gw(limited_emu):
    lanes = {
        "strict": lane(limited_emu.url),
        "lenient": lane(limited_emu.url, images_policy="drop_oldest", top_logprobs_policy="clamp",
                        placeholder_policy="escape"),
        "notemplate": {**lane(limited_emu.url), "render": {"template": None}},
    }
    with run_gateway(routes(lanes)) as g:
        yield g


@pytest.fixture()
def client(gw):
    return openai.OpenAI(base_url=gw.base_url, api_key="test", max_retries=0, timeout=30)


@pytest.fixture()
def direct(limited_emu):
    return openai.OpenAI(base_url=limited_emu.base_url, api_key="test", max_retries=0, timeout=30)


def img(k: int) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,iVBORw0KGgo{k:04d}"}}


def image_history(n: int) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "You describe screenshots."}]
    for k in range(n):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"Screenshot {k}:"}, img(k)]})
        msgs.append({"role": "assistant", "content": f"Screenshot {k} shows a terminal."})
    msgs.append({"role": "user", "content": "What changed?"})
    return msgs


def n_images(body: dict) -> int:
    return sum(1 for m in body["messages"] if isinstance(m.get("content"), list)
               for p in m["content"] if p.get("type") == "image_url")


def requests_seen(limited_emu) -> int:
    return limited_emu.stats()["requests"]


def last_body(limited_emu) -> dict:
    return limited_emu.stats()["recent"][-1]["body"]


def refused(client, limited_emu, **kw) -> openai.BadRequestError:
    before = requests_seen(limited_emu)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**kw)
    assert requests_seen(limited_emu) == before, "a refused request must not reach the engine"
    err = info.value
    assert err.status_code == 400
    assert set(err.body) == {"message", "type", "param", "code"} and err.body["type"] == "invalid_request_error"
    return err


# -- images ----------------------------------------------------------------------------------------------


def test_fifth_image_in_history_is_refused_with_places(client, direct, limited_emu):
    msgs = image_history(5)
    with pytest.raises(openai.BadRequestError, match="At most 4 image"):  # the engine's own answer
        direct.chat.completions.create(model="deepseek-v4-flash", messages=msgs, max_tokens=4)
    err = refused(client, limited_emu, model="strict", messages=msgs, max_tokens=4)
    assert err.code == "too_many_images" and err.param == "messages[9].content[1]"
    assert "5 images" in err.message and "at most 4" in err.message and "messages[1].content[1]" in err.message


def test_four_images_pass(client, limited_emu):
    r = client.chat.completions.create(model="strict", messages=image_history(4), max_tokens=4)
    assert r.choices[0].message.content is not None and n_images(last_body(limited_emu)) == 4


@pytest.mark.parametrize("stream", [False, True])
def test_drop_oldest_forwards_what_the_engine_accepts(client, limited_emu, stream):
    raw = client.chat.completions.with_raw_response.create(model="lenient", messages=image_history(7),
                                                          max_tokens=4, stream=stream)
    assert raw.status_code == 200
    assert raw.headers["x-gateway-limits"] == "max_images dropped=3 limit=4 first_message=1"
    out = raw.parse()
    if stream:
        assert "".join(c.choices[0].delta.content or "" for c in out if c.choices)
    else:
        assert out.choices[0].message.content
    body = last_body(limited_emu)
    assert n_images(body) == 4
    texts = [p["text"] for m in body["messages"] if isinstance(m["content"], list) for p in m["content"]
             if p["type"] == "text"]
    assert texts.count("[image removed by gateway: lane limit 4]") == 3
    assert body["messages"][7]["content"][1]["type"] == "image_url"  # the newest four stay


# -- top_logprobs ------------------------------------------------------------------------------------------


def test_top_logprobs_reject_clamp_and_rules(client, direct, limited_emu):
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError):
        direct.chat.completions.create(model="x", messages=msgs, max_tokens=2, logprobs=True, top_logprobs=40)
    err = refused(client, limited_emu, model="strict", messages=msgs, max_tokens=2, logprobs=True, top_logprobs=40)
    assert (err.code, err.param) == ("top_logprobs_too_large", "top_logprobs")
    raw = client.chat.completions.with_raw_response.create(model="lenient", messages=msgs, max_tokens=2,
                                                          logprobs=True, top_logprobs=40)
    assert raw.status_code == 200 and raw.headers["x-gateway-limits"] == "max_top_logprobs clamped=40 limit=32"
    assert last_body(limited_emu)["top_logprobs"] == 32
    err = refused(client, limited_emu, model="lenient", messages=msgs, max_tokens=2, top_logprobs=3)
    assert err.param == "top_logprobs" and "logprobs" in err.message
    err = refused(client, limited_emu, model="lenient", messages=msgs, max_tokens=2, logprobs=True, top_logprobs=-2)
    assert err.code == "integer_below_min_value"
    r = client.chat.completions.create(model="strict", messages=msgs, max_tokens=2, logprobs=True, top_logprobs=32)
    assert r.choices


# -- placeholders --------------------------------------------------------------------------------------------


def test_placeholder_reject_and_escape(client, direct, limited_emu):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": f"Why does {PH} break you?"}]
    with pytest.raises(openai.BadRequestError):  # the engine's renderer refuses the literal token
        direct.chat.completions.create(model="x", messages=msgs, max_tokens=2)
    err = refused(client, limited_emu, model="strict", messages=msgs, max_tokens=2)
    assert err.code == "invalid_placeholder_token" and err.param == "messages[2].content"
    assert "message 2" in err.message
    raw = client.chat.completions.with_raw_response.create(model="lenient", messages=msgs, max_tokens=2)
    assert raw.status_code == 200 and raw.headers["x-gateway-limits"] == "placeholder_tokens escaped=1"
    forwarded = last_body(limited_emu)["messages"][2]["content"]
    assert PH not in forwarded and forwarded.replace("\u200d", "") == msgs[2]["content"]


# -- context window -------------------------------------------------------------------------------------------


def text_of_tokens(n: int) -> str:
    from gateway.render.tokenizer import load_tokenizer

    tok = load_tokenizer()
    words = " ".join(f"item{k % 50} alpha" for k in range(n))
    ids = tok.encode(words)[:n]
    return tok.decode(ids)


@pytest.mark.parametrize("model", ["strict", "notemplate"])
def test_context_window_refused_before_the_engine(client, direct, limited_emu, model):
    text = text_of_tokens(3000)
    msgs = [{"role": "user", "content": text}]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        direct.chat.completions.create(model="x", messages=msgs, max_tokens=1500)
    err = refused(client, limited_emu, model=model, messages=msgs, max_tokens=1500)
    assert (err.code, err.param) == ("context_length_exceeded", "messages")
    assert f"maximum context length is {WINDOW} tokens" in err.message and "1500 in the completion" in err.message
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=500)
    assert r.choices and r.usage.prompt_tokens + 500 <= WINDOW


def test_output_cap(limited_emu):
    with run_gateway(routes({"l": lane(limited_emu.url, max_output_tokens=64)}, {"m": "l"})) as g:
        c = openai.OpenAI(base_url=g.base_url, api_key="t", max_retries=0, timeout=30)
        err = refused(c, limited_emu, model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=65)
        assert (err.code, err.param) == ("invalid_value", "max_tokens")
        assert c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=64)


# -- size caps ------------------------------------------------------------------------------------------------------


def test_message_count_and_request_bytes(client, gw, limited_emu):
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * 30 + [
        {"role": "user", "content": "z"}]
    err = refused(client, limited_emu, model="strict", messages=msgs, max_tokens=2)
    assert (err.code, err.param) == ("too_many_messages", "messages")
    before = requests_seen(limited_emu)
    big = {"model": "strict", "max_tokens": 2,
           "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, img(0)]}]}
    big["messages"][0]["content"][1]["image_url"]["url"] += "A" * 500_000
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**big)
    assert info.value.status_code == 413 and info.value.body["code"] == "request_too_large"
    assert requests_seen(limited_emu) == before


def test_error_bodies_are_exactly_openai_shaped(gw):
    body = {"model": "strict", "messages": image_history(6), "max_tokens": 2}
    r = httpx.post(gw.base_url + "/chat/completions", content=orjson.dumps(body),
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert list(r.json()) == ["error"] and r.json()["error"]["code"] == "too_many_images"


def test_no_limit_check_failed_inside_the_gateway(gw):
    assert "limits check failed" not in gw.log()


def test_completions_endpoint_is_policed_too(client, limited_emu):
    before = requests_seen(limited_emu)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="strict", prompt=f"Describe {PH}", max_tokens=2)
    assert info.value.code == "invalid_placeholder_token" and info.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="strict", prompt=list(range(WINDOW)), max_tokens=2)
    assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
    assert requests_seen(limited_emu) == before
    raw = client.completions.with_raw_response.create(model="lenient", prompt=f"Describe {PH}", max_tokens=2)
    assert raw.status_code == 200 and raw.headers["x-gateway-limits"] == "placeholder_tokens escaped=1"
