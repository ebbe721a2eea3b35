"""Cache-protecting admission (gateway/admission/): a new conversation waits or is refused while the lane's
pool cannot hold it beside the active conversations; continuing conversations are never held. A real
gateway in front of the emulator; the pool is the lane's `admission.pool_tokens`."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.support.admission import POOL, admission_routes, diverting_routes, newcomer
from tests.support.gateway_proc import run_gateway
from tests.support.metrics import metric
from tests.support.poll import wait_until
from tests.support.records import recent, record_of
from tests.support.routes import agent_lane


def _admission(gw, request_id: str) -> dict:
    """What admission decided for the request, from its record."""
    rec = wait_until(lambda: next((r for r in recent(gw) if r["request_id"] == request_id
                                   and r["admission"] is not None), None), what=f"the admission note of {request_id}")
    return json.loads(rec["admission"])


def _inflight(gw) -> float:
    return metric(gw.url, "gateway_inflight_requests", lane="ds") or 0.0


def test_a_newcomer_waits_until_the_active_conversation_goes_idle(agent_emu) -> None:
    with run_gateway(admission_routes(agent_emu.url, policy="hold", hold_s=20, idle_after_s=2)) as gw, \
            httpx.Client(base_url=gw.url, timeout=60) as client:
        first = client.post("/v1/chat/completions", json=newcomer("alpha", 1800))
        assert first.status_code == 200, first.text
        t0 = time.monotonic()
        second = client.post("/v1/chat/completions", json=newcomer("beta", 900))
        waited = time.monotonic() - t0
        assert second.status_code == 200, second.text
        rid = second.headers["x-request-id"]
        note = _admission(gw, rid)
        assert note["decision"] == "admitted_after_hold", note
        assert note["waited_s"] >= 1.0 and waited >= 1.0, (note, waited)
        assert note["pool_tokens"] == POOL and note["active_conversations"] == 0, note
        metrics = client.get("/metrics").text
        assert 'gateway_admissions_total{decision="admitted_after_hold",lane="ds"} 1.0' in metrics
        assert 'gateway_admissions_total{decision="admitted",lane="ds"} 1.0' in metrics


def test_a_continuing_conversation_is_never_held_and_a_newcomer_is_refused(agent_emu) -> None:
    with run_gateway(admission_routes(agent_emu.url, policy="refuse", idle_after_s=60)) as gw, \
            httpx.Client(base_url=gw.url, timeout=60) as client:
        body = newcomer("gamma", 1800)
        first = client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]
        history = [{"role": "assistant", "content": answer.get("content") or ""},
                   {"role": "user", "content": "and more: " + "ipsum " * 400}]
        t0 = time.monotonic()
        second = client.post("/v1/chat/completions", json={**body, "messages": body["messages"] + history})
        assert second.status_code == 200 and time.monotonic() - t0 < 5, second.text
        refused = client.post("/v1/chat/completions", json=newcomer("delta", 900))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "cache_admission"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        rid = refused.headers["x-request-id"]
        note = _admission(gw, rid)
        assert note["decision"] == "refused" and note["active_conversations"] == 1, note
        assert note["active_tokens"] > 1800 and "active conversations hold" in note["reason"], note


def test_a_newcomer_held_too_long_is_refused_and_admit_lets_everyone_in(agent_emu) -> None:
    with run_gateway(admission_routes(agent_emu.url, policy="hold", hold_s=1, then="refuse", idle_after_s=60)) as gw, \
            httpx.Client(base_url=gw.url, timeout=60) as client:
        assert client.post("/v1/chat/completions", json=newcomer("eps", 1800)).status_code == 200
        r = client.post("/v1/chat/completions", json=newcomer("zeta", 900))
        assert r.status_code == 429, r.text
        assert _admission(gw, r.headers["x-request-id"])["decision"] == "refused_after_hold"
    with run_gateway(admission_routes(agent_emu.url)) as gw, httpx.Client(base_url=gw.url, timeout=60) as client:
        for topic in ("eta", "theta", "iota"):
            r = client.post("/v1/chat/completions", json=newcomer(topic, 1800))
            assert r.status_code == 200, r.text


def test_held_newcomers_are_admitted_in_arrival_order(agent_emu) -> None:
    with run_gateway(admission_routes(agent_emu.url, policy="hold", hold_s=30, idle_after_s=1.5)) as gw:
        with httpx.Client(base_url=gw.url, timeout=60) as client:
            assert client.post("/v1/chat/completions", json=newcomer("kappa", 1800)).status_code == 200
        done: list[str] = []

        def arrive(topic: str) -> None:
            with httpx.Client(base_url=gw.url, timeout=60) as c:
                assert c.post("/v1/chat/completions", json=newcomer(topic, 1400)).status_code == 200
                done.append(topic)

        threads = []
        for n, topic in enumerate(("lambda", "mu"), start=1):
            t = threading.Thread(target=arrive, args=(topic,))
            t.start()
            threads.append(t)
            wait_until(lambda n=n: _inflight(gw) >= n, what=f"{n} newcomers held")  # the first queues first
        for t in threads:
            t.join(60)
    assert done == ["lambda", "mu"], done


def test_a_newcomer_is_diverted_to_a_lane_with_room_and_its_later_turns_follow_it(agent_emu) -> None:
    with run_gateway(diverting_routes(agent_emu.url)) as gw, httpx.Client(base_url=gw.url, timeout=60) as client:
        assert client.post("/v1/chat/completions", json=newcomer("nu", 1800)).status_code == 200
        body = newcomer("xi", 900)
        first = client.post("/v1/chat/completions", json=body)
        assert first.status_code == 200, first.text
        assert first.headers["x-gateway-fallback"] == "ds-b; from=ds; reason=cache_admission"
        rec = record_of(gw, first.headers["x-request-id"])
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
        rec = record_of(gw, second.headers["x-request-id"])
        assert rec["lane"] == "ds-b" and rec["admission"] is None, rec
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 1500
        # Neither lane holds a third newcomer: it is held for hold_s, then refused by the deciding lane.
        refused = client.post("/v1/chat/completions", json=newcomer("omicron", 2000))
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "cache_admission", refused.text
        note = json.loads(record_of(gw, refused.headers["x-request-id"])["admission"])
        assert note["decision"] == "refused_after_hold" and note["lane"] == "ds", note
        metrics = client.get("/metrics").text
        assert 'gateway_admissions_total{decision="diverted",lane="ds"} 1.0' in metrics
        assert 'gateway_admissions_total{decision="admitted",lane="ds"} 1.0' in metrics


def test_divert_names_the_lanes_it_may_send_to() -> None:
    import yaml

    from gateway.core.config import ConfigError, parse_routes

    base = diverting_routes("http://127.0.0.1:9")
    cases = [({"policy": "divert", "divert_to": []}, "lanes.ds.admission: divert_to: policy divert needs"),
             ({"policy": "divert", "divert_to": ["nope"]},
              "lanes.ds.admission.divert_to.0: lane 'nope' is not defined"),
             ({"policy": "divert", "divert_to": ["ds"]},
              "lanes.ds.admission.divert_to.0: a lane cannot divert to itself")]
    for admission, message in cases:
        routes = {**base, "lanes": {**base["lanes"], "ds": agent_lane("http://127.0.0.1:9", admission=admission)}}
        with pytest.raises(ConfigError) as err:
            parse_routes(yaml.safe_dump(routes))
        assert message in str(err.value), str(err.value)
