"""Cache-protecting admission (gateway/admission/): a new conversation waits or is refused while the lane's
pool cannot hold it beside the active conversations; continuing conversations are never held. A real
gateway in front of the emulator; the pool is the lane's `admission.pool_tokens`."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.support.conversations import AGENT_EMULATOR, lane
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until

POOL = 4500


@pytest.fixture(scope="module")
def emu():
    with run_emulator(**AGENT_EMULATOR) as e:
        yield e


def _routes(url: str, **admission) -> dict:
    return {"lanes": {"ds": lane(url, admission={"pool_tokens": POOL, **admission})}, "models": {"ds": "ds"}}


def _body(topic: str, words: int, history: list | None = None) -> dict:
    messages = [{"role": "user", "content": f"{topic}: " + "lorem " * words}, *(history or [])]
    return {"model": "ds", "max_tokens": 8, "messages": messages}


def _records(gw) -> list[dict]:
    return httpx.get(gw.url + "/admin/api/records", params={"limit": 50}).json()["records"]


def _admission(gw, request_id: str) -> dict | None:
    rec = next((r for r in _records(gw) if r["request_id"] == request_id), None)
    return None if rec is None or rec["admission"] is None else json.loads(rec["admission"])


def _inflight(gw) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith('gateway_inflight_requests{lane="ds"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_newcomer_waits_until_the_active_conversation_goes_idle(emu) -> None:
    with run_gateway(_routes(emu.url, policy="hold", hold_s=20, idle_after_s=2)) as gw, \
            httpx.Client(base_url=gw.url, timeout=60) as client:
        first = client.post("/v1/chat/completions", json=_body("alpha", 1800))
        assert first.status_code == 200, first.text
        t0 = time.monotonic()
        second = client.post("/v1/chat/completions", json=_body("beta", 900))
        waited = time.monotonic() - t0
        assert second.status_code == 200, second.text
        rid = second.headers["x-request-id"]
        wait_until(lambda: _admission(gw, rid) is not None, what="the newcomer's record")
        note = _admission(gw, rid)
        assert note["decision"] == "admitted_after_hold", note
        assert note["waited_s"] >= 1.0 and waited >= 1.0, (note, waited)
        assert note["pool_tokens"] == POOL and note["active_conversations"] == 0, note
        metrics = client.get("/metrics").text
        assert 'gateway_admissions_total{decision="admitted_after_hold",lane="ds"} 1.0' in metrics
        assert 'gateway_admissions_total{decision="admitted",lane="ds"} 1.0' in metrics


def test_a_continuing_conversation_is_never_held_and_a_newcomer_is_refused(emu) -> None:
    with run_gateway(_routes(emu.url, policy="refuse", idle_after_s=60)) as gw, \
            httpx.Client(base_url=gw.url, timeout=60) as client:
        body = _body("gamma", 1800)
        first = client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]
        history = [{"role": "assistant", "content": answer.get("content") or ""},
                   {"role": "user", "content": "and more: " + "ipsum " * 400}]
        t0 = time.monotonic()
        second = client.post("/v1/chat/completions", json={**body, "messages": body["messages"] + history})
        assert second.status_code == 200 and time.monotonic() - t0 < 5, second.text
        refused = client.post("/v1/chat/completions", json=_body("delta", 900))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "cache_admission"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        rid = refused.headers["x-request-id"]
        wait_until(lambda: _admission(gw, rid) is not None, what="the refusal's record")
        note = _admission(gw, rid)
        assert note["decision"] == "refused" and note["active_conversations"] == 1, note
        assert note["active_tokens"] > 1800 and "active conversations hold" in note["reason"], note


def test_a_newcomer_held_too_long_is_refused_and_admit_lets_everyone_in(emu) -> None:
    with run_gateway(_routes(emu.url, policy="hold", hold_s=1, then="refuse", idle_after_s=60)) as gw, \
            httpx.Client(base_url=gw.url, timeout=60) as client:
        assert client.post("/v1/chat/completions", json=_body("eps", 1800)).status_code == 200
        r = client.post("/v1/chat/completions", json=_body("zeta", 900))
        assert r.status_code == 429, r.text
        wait_until(lambda: _admission(gw, r.headers["x-request-id"]) is not None, what="the record")
        assert _admission(gw, r.headers["x-request-id"])["decision"] == "refused_after_hold"
    with run_gateway(_routes(emu.url)) as gw, httpx.Client(base_url=gw.url, timeout=60) as client:
        for topic in ("eta", "theta", "iota"):
            r = client.post("/v1/chat/completions", json=_body(topic, 1800))
            assert r.status_code == 200, r.text


def test_held_newcomers_are_admitted_in_arrival_order(emu) -> None:
    with run_gateway(_routes(emu.url, policy="hold", hold_s=30, idle_after_s=1.5)) as gw:
        with httpx.Client(base_url=gw.url, timeout=60) as client:
            assert client.post("/v1/chat/completions", json=_body("kappa", 1800)).status_code == 200
        done: list[str] = []

        def newcomer(topic: str) -> None:
            with httpx.Client(base_url=gw.url, timeout=60) as c:
                assert c.post("/v1/chat/completions", json=_body(topic, 1400)).status_code == 200
                done.append(topic)

        threads = []
        for n, topic in enumerate(("lambda", "mu"), start=1):
            t = threading.Thread(target=newcomer, args=(topic,))
            t.start()
            threads.append(t)
            wait_until(lambda n=n: _inflight(gw) >= n, what=f"{n} newcomers held")  # the first queues first
        for t in threads:
            t.join(60)
    assert done == ["lambda", "mu"], done


def _diverting_routes(url: str) -> dict:
    return {"lanes": {"ds": lane(url, admission={"pool_tokens": POOL, "policy": "divert", "divert_to": ["ds-b"],
                                                 "hold_s": 1, "idle_after_s": 60}),
                      "ds-b": lane(url, admission={"pool_tokens": POOL, "idle_after_s": 60})},
            "models": {"ds": "ds"}}


def _record(gw, request_id: str) -> dict:
    wait_until(lambda: any(r["request_id"] == request_id for r in _records(gw)), what=f"the record of {request_id}")
    return next(r for r in _records(gw) if r["request_id"] == request_id)


def test_a_newcomer_is_diverted_to_a_lane_with_room_and_its_later_turns_follow_it(emu) -> None:
    with run_gateway(_diverting_routes(emu.url)) as gw, httpx.Client(base_url=gw.url, timeout=60) as client:
        assert client.post("/v1/chat/completions", json=_body("nu", 1800)).status_code == 200
        body = _body("xi", 900)
        first = client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        assert first.headers["x-gateway-fallback"] == "ds-b; from=ds; reason=cache_admission"
        rec = _record(gw, first.headers["x-request-id"])
        note = json.loads(rec["admission"])
        assert rec["lane"] == "ds-b" and rec["fallback_from"] == "ds", rec
        assert note["decision"] == "diverted" and note["diverted_to"] == "ds-b" and note["lane"] == "ds", note
        assert "ds-b holds it: 0 active conversations" in note["reason"], note
        # Its next turn goes where its prefix is cached, on every turn, whatever the first lane's room.
        answer = first.json()["choices"][0]["message"]
        history = [{"role": "assistant", "content": answer.get("content") or ""},
                   {"role": "user", "content": "go on: " + "ipsum " * 50}]
        second = client.post("/v1/chat/completions", json={**body, "messages": body["messages"] + history})
        assert second.status_code == 200, second.text
        assert second.headers["x-gateway-fallback"] == "ds-b; from=ds; reason=diverted_conversation"
        assert second.headers["x-gateway-conversation"].split(";")[0] == \
            first.headers["x-gateway-conversation"].split(";")[0]
        rec = _record(gw, second.headers["x-request-id"])
        assert rec["lane"] == "ds-b" and rec["admission"] is None, rec
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 1500
        # Neither lane holds a third newcomer: it is held for hold_s, then refused by the deciding lane.
        refused = client.post("/v1/chat/completions", json=_body("omicron", 2000))
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "cache_admission", refused.text
        note = json.loads(_record(gw, refused.headers["x-request-id"])["admission"])
        assert note["decision"] == "refused_after_hold" and note["lane"] == "ds", note
        metrics = client.get("/metrics").text
        assert 'gateway_admissions_total{decision="diverted",lane="ds"} 1.0' in metrics
        assert 'gateway_admissions_total{decision="admitted",lane="ds"} 1.0' in metrics


def test_divert_names_the_lanes_it_may_send_to() -> None:
    import yaml

    from gateway.core.config import ConfigError, parse_routes

    base = _diverting_routes("http://127.0.0.1:9")
    cases = [({"policy": "divert", "divert_to": []}, "lanes.ds.admission: divert_to: policy divert needs"),
             ({"policy": "divert", "divert_to": ["nope"]},
              "lanes.ds.admission.divert_to.0: lane 'nope' is not defined"),
             ({"policy": "divert", "divert_to": ["ds"]},
              "lanes.ds.admission.divert_to.0: a lane cannot divert to itself")]
    for admission, message in cases:
        routes = {**base, "lanes": {**base["lanes"], "ds": lane("http://127.0.0.1:9", admission=admission)}}
        with pytest.raises(ConfigError) as err:
            parse_routes(yaml.safe_dump(routes))
        assert message in str(err.value), str(err.value)
