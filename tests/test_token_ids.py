"""The gateway asks vLLM for token ids itself: the record compares content, and the
client sees exactly what it would have seen without the flag, unless it asked itself."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pipeline import token_ids
from gateway.core.exchange import Exchange
from gateway.relay.sse import EventSplitter
from tests.support.conversations import wait_analysed, wait_record
from tests.support.emulator_proc import AGENT_EMULATOR, run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import agent_lane, agent_routes, lane_config, routes

FIXTURES = Path("/work/shared/fixtures/upstream")


def _events(name: str) -> list[bytes]:
    return EventSplitter().feed((FIXTURES / name).read_bytes() + b"\n\n")


def _asked(event: bytes, prompt: list[int], gen: list[int]) -> bytes:
    """The event as vLLM sends it with return_token_ids (its null id fields filled)."""
    event = event.replace(b'"prompt_token_ids":null', b'"prompt_token_ids":' + orjson.dumps(prompt))
    return event.replace(b'"token_ids":null', b'"token_ids":' + orjson.dumps(gen))


# -- bytes --------------------------------------------------------------------------------------------
def test_stripping_gives_back_the_stream_vllm_sends_when_not_asked():
    plain = _events("vllm_stream_deepseek.sse")
    assert b'"prompt_token_ids":null' in plain[0] and b'"token_ids":null' in plain[1]
    seen_prompt, seen_gen = None, []
    for i, event in enumerate(plain):
        out, prompt, gen = token_ids.strip_chunk(_asked(event, [0, 129280, 17, 4], [1000 + i, 7]))
        assert out == event, (out, event)
        seen_prompt = prompt if prompt is not None else seen_prompt
        seen_gen += gen or []
    assert seen_prompt == [0, 129280, 17, 4]
    assert len(seen_gen) == 2 * sum(b'"token_ids":null' in e for e in plain)


def test_a_chunk_that_exists_only_for_its_ids_is_dropped():
    head = _events("vllm_stream_deepseek.sse")[1].split(b'"choices":[')[0] + b'"choices":['
    id_only = head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[128799]}]}\n\n'
    assert token_ids.strip_chunk(id_only) == (None, None, [128799])
    finish = head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,' \
                    b'"token_ids":[1]}]}\n\n'
    out, _, gen = token_ids.strip_chunk(finish)
    assert out == finish.replace(b"[1]", b"null") and gen == [1]
    with_logprobs = id_only.replace(b'"logprobs":null', b'"logprobs":{"content":[]}')
    assert token_ids.strip_chunk(with_logprobs)[0] is not None  # vLLM sends it unasked too


@settings(max_examples=200, deadline=None)
@given(text=st.text(), prompt=st.lists(st.integers(0, 2**31), max_size=40),
       gen=st.lists(st.integers(0, 2**31), min_size=1, max_size=5))
def test_text_that_looks_like_ids_is_never_touched(text, prompt, gen):
    # Whatever the model writes (JSON-escaped, as the engine sends it) stays as it is.
    tricky = text + ' "token_ids":[1] token_ids":[2]'
    plain = (b'data: {"id":"x","choices":[{"index":0,"delta":{"content":' + orjson.dumps(tricky)
             + b'},"logprobs":null,"finish_reason":null,"token_ids":null}],"prompt_token_ids":null}\n\n')
    out, p, g = token_ids.strip_chunk(_asked(plain, prompt, gen))
    assert out == plain and p == prompt and g == gen


def test_the_relay_keeps_the_ids_for_the_analysis_and_parses_the_prompts_later():
    plain = _events("vllm_stream_deepseek.sse")
    ex = Exchange("r")
    out = [token_ids.take(ex, _asked(e, [0, 129280, 17], [1000 + i])) for i, e in enumerate(plain)]
    assert out == plain
    assert ex.generated.prompt_token_ids == b"[0,129280,17]"  # its JSON: parsed by the analysis, off the loop
    assert ex.generated.token_ids == [1000 + i for i, e in enumerate(plain) if b'"token_ids":null' in e]
    assert token_ids.parse_ids(ex.generated.prompt_token_ids) == [0, 129280, 17]


def test_whole_bodies_compact_or_spaced():
    fixture = json.loads((FIXTURES / "vllm_nonstream_deepseek.json").read_text())
    assert "prompt_token_ids" in fixture and "token_ids" in fixture["choices"][0]
    for dumps in (orjson.dumps, lambda o: json.dumps(o).encode()):
        asked = dict(fixture, prompt_token_ids=[5, 6, 7])
        asked["choices"] = [dict(fixture["choices"][0], token_ids=[8, 9])]
        out, prompt, gen = token_ids.strip_body(dumps(asked))
        assert json.loads(out) == fixture and prompt == [5, 6, 7] and gen == [8, 9]


def test_cost_per_chunk():
    """CPU per chunk: stripping a chunk with ids, and the find that passes a chunk without, against a
    parse of the same chunk measured in the same rounds (interleaved, the best of each: a busy machine
    slows all three alike; measured ~1 µs for the strip on a quiet machine, ~3 µs on a loaded one)."""
    plain = _events("vllm_stream_deepseek.sse")[2]
    asked = _asked(plain, [], [128000])
    n = 5000
    ex = Exchange("r")
    calls = {"strip": (lambda c: token_ids.take(ex, c), asked), "passing": (lambda c: token_ids.take(ex, c), plain),
             "control": (orjson.loads, asked[5:])}
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(7):
        for name, (fn, chunk) in calls.items():
            t0 = time.process_time()
            for _ in range(n):
                fn(chunk)
            best[name] = min(best[name], (time.process_time() - t0) / n)
    print(f"take (strip, keep the ids) {best['strip'] * 1e6:.2f} µs/chunk, nothing to strip "
          f"{best['passing'] * 1e6:.2f} µs, orjson.loads {best['control'] * 1e6:.2f} µs")
    assert best["strip"] < best["control"] * 3 and best["passing"] < best["control"] * 2


# -- who is asked ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lane, path, client, asked, why", [
    (lane_config(), "/v1/chat/completions", None, True, None),
    (lane_config(), "/v1/chat/completions", True, False, None),  # the client asked: it gets them
    (lane_config(), "/v1/chat/completions", False, True, None),
    (lane_config(token_ids="off"), "/v1/chat/completions", None, False, token_ids.WHY_OFF),
    (lane_config(engine="sglang"), "/v1/chat/completions", None, False, token_ids.why_engine("sglang")),
    (lane_config(), "/v1/completions", None, False, token_ids.WHY_PATH),
])
def test_who_is_asked(lane, path, client, asked, why):
    ex = Exchange("r", path=path)
    body = {"messages": []} if client is None else {"messages": [], "return_token_ids": client}
    token_ids.ask(ex, lane, body)
    assert ex.token_ids_strip is asked and ex.token_ids_why == why
    assert body.get("return_token_ids") is (True if asked or client else client)
    assert token_ids.why_counts(ex) == (why or token_ids.WHY_ASKED_NONE)
    ex.generated.prompt_token_ids = [1]
    assert token_ids.why_counts(ex) is None


# -- end to end: the emulator as vLLM with the real DeepSeek renderer -------------------------------------
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]


def _sse(resp: httpx.Response) -> list[bytes]:
    return EventSplitter().feed(resp.read() + b"\n\n")


def _choices(events: list[bytes]) -> list[bytes]:
    """What a stream says, without its envelope (ids, model, created differ by route)."""
    return [e.split(b'"choices":', 1)[1] for e in events if b'"choices":' in e]


def _post(url: str, body: dict, cid: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30, headers={"X-Request-Id": cid})


def test_client_without_ids_sees_none_and_the_record_compares_them(agent_emu):
    body = {"model": "ds", "messages": MSGS, "max_tokens": 20, "reasoning_effort": "high", "stream": True}
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        r = _post(gw.url, {**body, "user": "a"}, "t1")
        events = _sse(r)
        assert b"token_ids\":[" not in b"".join(events)
        # Exactly what vLLM streams when not asked: the same chunks, ids as null, no id-only chunk.
        asked = _sse(httpx.post(agent_emu.url + "/v1/chat/completions", json={**body, "return_token_ids": True}))
        plain = _sse(httpx.post(agent_emu.url + "/v1/chat/completions", json=body))
        assert len(asked) == len(plain) + 1  # the emulator, as vLLM, sends `</think>` in a chunk of its own
        assert _choices(events) == _choices(plain)
        cid = r.headers["x-gateway-conversation"].split(";")[0]
        cache = wait_analysed(gw, cid, 1)["last_cache"]
        assert cache["render_check"] == "token_ids" and cache["render_matches_engine"] is True, cache
        row = wait_record(gw, cid, 1)
        assert (row["render_check"], row["render_matches_engine"], row["render_check_why"]) == ("token_ids", 1, None)

        r = _post(gw.url, {**body, "stream": False, "user": "b"}, "t2")
        whole = r.json()
        assert whole["prompt_token_ids"] is None and whole["choices"][0]["token_ids"] is None
        cache = wait_analysed(gw, r.headers["x-gateway-conversation"].split(";")[0], 1)["last_cache"]
        assert cache["render_check"] == "token_ids" and cache["render_matches_engine"] is True, cache


def test_client_that_asks_gets_them(agent_emu):
    body = {"model": "ds", "messages": MSGS, "max_tokens": 20, "return_token_ids": True}
    with run_gateway(agent_routes(agent_emu.url)) as gw:
        events = _sse(_post(gw.url, {**body, "stream": True}, "t3"))
        first = orjson.loads(events[0][5:])
        assert isinstance(first["prompt_token_ids"], list) and len(first["prompt_token_ids"]) > 5
        assert any(b'"delta":{}' in e and b'"finish_reason":null' in e for e in events)  # id-only chunks kept
        whole = _post(gw.url, body, "t4").json()
        assert whole["prompt_token_ids"] == first["prompt_token_ids"] and whole["choices"][0]["token_ids"]


def test_lanes_that_are_not_asked_compare_counts_and_say_why(agent_emu):
    with run_emulator(**{**AGENT_EMULATOR, "flavour": "sglang"}) as sg:
        with run_gateway(routes({"off": agent_lane(agent_emu.url, token_ids="off"),
                                 "sg": agent_lane(sg.url, engine="sglang")})) as gw:
            for model, why in (("off", token_ids.WHY_OFF), ("sg", token_ids.why_engine("sglang"))):
                r = _post(gw.url, {"model": model, "messages": MSGS, "max_tokens": 20, "stream": True,
                                   "user": "c-" + model}, "t5-" + model)
                assert b"token_ids\":[" not in r.read()
                cid = r.headers["x-gateway-conversation"].split(";")[0]
                cache = wait_analysed(gw, cid, 1)["last_cache"]
                assert cache["render_check"] == "count" and cache["render_check_why"] == why, cache
                row = wait_record(gw, cid, 1)
                assert row["render_check"] == "count" and row["render_check_why"] == why, row
