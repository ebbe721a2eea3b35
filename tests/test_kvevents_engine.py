"""KV-cache events on the real engine: vLLM publishes its KV-cache events (--kv-events-config), the gateway
subscribes, and two conversations that do not fit the 127-block pool together take turns.

Required, on every turn of both: the cached tokens the engine reported equal what the gateway's index
of the engine's events says was held when the turn was sent; every eviction verdict names the other
conversation as the one whose stored blocks pushed the prefix out; and the pool-pressure forecast
warned about a conversation before its first miss. Figures go to tests/artifacts/kvevents-engine.json.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.engine_proc import KV_TOPIC, REPO, EngineProc, engine_lane
from tests.support.gateway_proc import run_gateway
from tests.support.engine_agent import Agent, filler
from tests.support.poll import wait_until
from tests.support.records import recent

pytestmark = pytest.mark.engine

ARTIFACT = REPO / "tests" / "artifacts" / "kvevents-engine.json"



def kv_routes(engine: EngineProc) -> dict[str, Any]:
    if engine.kv_endpoint is None:
        pytest.skip("this engine does not publish KV events (ENGINE_URL without ENGINE_KV_EVENTS)")
    lane = engine_lane(engine.url, kv_events={"replicas": {engine.url: {
        "endpoint": engine.kv_endpoint, "bind": True, "replay": engine.kv_replay, "topic": KV_TOPIC}}})
    return {"lanes": {"vllm-cpu-kv": lane}, "models": {"ds": "vllm-cpu-kv"}}


def record(gw, cid: str, turn: int) -> dict[str, Any]:
    """The record of `turn` of `cid` once it has its KV verdict (decoded)."""
    def judged() -> dict[str, Any] | None:
        row = next((r for r in recent(gw, conversation=cid) if r.get("turn") == turn and r.get("kv")), None)
        if row is None:
            return None
        return {**row, "kv": json.loads(row["kv"]) if isinstance(row["kv"], str) else row["kv"]}

    return wait_until(judged, what=f"a record with a kv verdict for turn {turn} of {cid}",
                      detail=lambda: gw.log()[-3000:])


def test_two_conversations_that_do_not_fit_the_pool(engine):
    with run_gateway(kv_routes(engine)) as gw:
        def ready() -> dict[str, Any] | None:  # subscribed, and the pool size read from the engine's /metrics
            view = httpx.get(f"{gw.url}/admin/api/kv").json()["replicas"][0]
            return view if view["stream"]["state"] == "live" and view["pool_tokens"] else None

        view = wait_until(ready, what="the KV stream live and the pool known", interval=0.1)
        pool = (engine.pool_blocks - 1) * engine.block_size
        assert view["pool_tokens"] == pool and view["pool_source"] == "engine"

        agents = {name: Agent(gw, f"kv-{name}", user=f"kv-{name}", opening="\n" + filler(f"kv-{name}", 50))
                  for name in ("a", "b")}
        rows: list[dict[str, Any]] = []
        for rnd in range(5):
            for name, ag in agents.items():
                ag.turn(next_user=f"Round {rnd + 1}. More context:\n" + filler(f"{name}{rnd}", 20))
                rec = record(gw, ag.cid, ag.turns)
                rows.append({"conversation": name, "cid": ag.cid, "turn": ag.turns, "ts": rec["ts"],
                             "prompt_tokens": rec["rendered_prompt_tokens"], "verdict": rec["verdict"],
                             "cause": rec["cause"], "predicted": rec["predicted_cached_tokens"],
                             "reported": rec["cached_tokens"], "kv": rec["kv"]})
        view = httpx.get(f"{gw.url}/admin/api/kv").json()
        metrics = httpx.get(f"{gw.url}/metrics").text

    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps({"pool_tokens": pool, "turns": rows, "kv": view}, indent=1, default=str))
    names = {ag.cid: name for name, ag in agents.items()}
    for r in rows:  # the index matches the engine's own prefix cache on every turn
        assert r["kv"]["stream"] == "live", r
        assert r["kv"]["held_tokens"] == r["reported"] and r["kv"]["agrees"] is True, r
    misses = [r for r in rows if r["verdict"] == "eviction"]
    assert misses, f"no eviction: the two conversations fit the pool\n{json.dumps(rows, indent=1)}"
    for r in misses:  # ground truth: evicted by pool pressure, displaced by the other conversation
        assert r["cause"] == "pool_pressure" and r["kv"]["cause"] == "pool_pressure", r
        displacers = r["kv"]["displaced_by"]
        assert displacers and names.get(displacers[0]["conversation"]) not in (None, r["conversation"]), r
        assert r["kv"]["removed_at"] is not None and r["kv"]["removed_at"] < r["ts"], r
    first = misses[0]
    warned = [w for w in view["warnings"] if w["kind"] == "forecast_eviction" and w["conversation"] == first["cid"]]
    assert warned and warned[0]["at"] < first["ts"], (first, view["warnings"])
    alerts = [w for w in view["warnings"] if w["kind"] == "working_set_exceeds_pool"]
    assert alerts and alerts[0]["at"] < first["ts"], view["warnings"]
    replica = view["replicas"][0]
    assert replica["stream"]["gaps"] == 0 or replica["stream"]["unfilled"] == 0, replica["stream"]
    assert f'gateway_kv_stream_up{{lane="vllm-cpu-kv",replica="{engine.url}"}} 1.0' in metrics
    assert "gateway_kv_working_set_tokens" in metrics and "gateway_kv_forecast_evictions" in metrics


def test_a_cache_reset_in_the_step_that_schedules_the_next_turn(engine):
    """vLLM publishes AllBlocksCleared with the events of the next step; on an idle engine that is the
    step scheduling the conversation's next turn, so the clear arrives after the turn was sent, in one
    batch ahead of the turn's own stores. The record must say cache_cleared, and the index must agree
    with the engine then and afterwards."""
    with run_gateway(kv_routes(engine)) as gw:
        wait_until(lambda: httpx.get(f"{gw.url}/admin/api/kv").json()["replicas"][0]["stream"]["state"] == "live",
                   what="the KV stream live", interval=0.1)
        ag = Agent(gw, "kv-reset", user="kv-reset", opening="\n" + filler("kv-reset", 30))
        ag.turn(next_user="Go on.\n" + filler("reset1", 5))
        ag.turn(next_user="And then?\n" + filler("reset2", 5))
        before = record(gw, ag.cid, ag.turns)
        assert before["cached_tokens"] > 0 and before["kv"]["agrees"] is True, before
        reset = httpx.post(f"{engine.url}/reset_prefix_cache")
        if reset.status_code == 404:
            pytest.skip("this engine does not serve /reset_prefix_cache (VLLM_SERVER_DEV_MODE unset)")
        assert reset.status_code == 200, reset.text
        ag.turn(next_user="Once more.\n" + filler("reset3", 5))
        cleared = record(gw, ag.cid, ag.turns)
        ag.turn(next_user="Last.\n" + filler("reset4", 5))
        after = record(gw, ag.cid, ag.turns)
    assert cleared["cached_tokens"] == 0 and cleared["predicted_cached_tokens"] > 0, cleared
    assert cleared["verdict"] == "eviction" and cleared["cause"] == "cache_cleared", cleared
    kv = cleared["kv"]
    assert kv["cause"] == "cache_cleared" and kv["held_tokens"] == 0 and kv["agrees"] is True, kv
    assert after["cached_tokens"] > 0 and after["kv"]["agrees"] is True and after["verdict"] == "hit", after
