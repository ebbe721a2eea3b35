"""The reviewers' view of drift alerts without servers: grading, remedies, grouping, triage, look-up.

Then the same through the admin API in-process: filters, acknowledge and mute with expiry, the
client's own conversation key, bad input as clear 400s.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.conversations.alerts import grade, review, rule_matches
from gateway.conversations.identity import key_id
from gateway.conversations.lookup import candidate_ids
from gateway.conversations.remedies import DEFAULT, REMEDIES, REPIN, remedy_for
from gateway.records.record import client_of
from gateway.core.verdict import CacheVerdict
from tests.support.exchanges import exchange
from tests.support.inprocess import make_app
from tests.support.routes import lane, routes

README = Path(__file__).resolve().parents[1] / "docs" / "concepts" / "conversations.md"  # the cause table
NOW = 1_800_000_000.0


def row(cause: str, conversation: str = "c1", tokens: int = 5_000, seconds: float = 1.0, ts: float = NOW - 60,
        lane: str = "dsv41", client: str = "opencode", **kw) -> dict:
    return {"ts": ts, "request_id": f"r{ts}", "verdict": "drift", "cause": cause, "conversation": conversation,
            "tokens_lost": tokens, "seconds_lost": seconds, "lane": lane, "client": client, "tenant": "default",
            "turn": 3, "divergence_message_index": 0, "divergence_field": "content", **kw}


def test_every_documented_cause_has_a_remedy_and_unseen_causes_get_the_default() -> None:
    from gateway.conversations.causes import CAUSES  # the catalogue the docs' cause table is made from

    causes = set(CAUSES)
    text = README.read_text(encoding="utf-8")
    assert all(f"| `{c}` |" in text for c in causes), "every cause is in the docs' table"
    assert {"effort_changed", "reasoning_dropped_by_template", "tools_changed"} <= causes
    for cause in causes | {"unknown", "eviction", "rehomed"}:
        rem = REMEDIES.get(cause)
        assert rem is not None, f"no remedy for {cause}"
        assert rem.fixable_by in ("client", "lane", "nobody") and len(rem.remedy) > 40 and rem.title
    assert remedy_for("a_cause_invented_tomorrow") is DEFAULT
    assert remedy_for(None) is REMEDIES["unknown"]
    assert remedy_for("reasoning_dropped_by_template").fixable_by == "nobody"
    assert remedy_for("effort_changed", repinned=True) is REPIN
    assert remedy_for("tools_changed", repinned=True) is REMEDIES["tools_changed"]


def test_grade_by_tokens_seconds_and_frequency() -> None:
    assert grade(300_000, 75.0, 1, 1.0)[0] == "critical"  # one re-prefill of a long agent session
    assert grade(500, 0.1, 1, 1.0)[0] == "info"
    assert grade(3_000, 0.7, 1, 1.0)[0] == "minor"
    assert grade(2_500, 0.6, 6, 1.0)[0] == "major"  # small but keeps coming back
    sev, why = grade(25_000, 6.0, 2, 1.0)
    assert sev == "major" and "25.0K tokens" in why and "2 turns" in why


def test_review_groups_grades_and_orders_alerts() -> None:
    rows = [
        row("tools_changed", "c1", 150_000, 40.0, ts=NOW - 300),
        row("tools_changed", "c1", 100_000, 25.0, ts=NOW - 200),  # same conversation and cause: one alert
        row("reasoning_dropped_by_template", "c2", 400_000, 100.0),  # big, but nobody can fix it
        row("effort_changed", "c3", 50_000, 12.0, effort_action="repinned"),  # asked for
        row("effort_changed", "c4", 50_000, 12.0, effort_action="warned"),
        row("brand_new_cause", "c5", 100, 0.01),
        {**row("x", "c6"), "verdict": "hit"},  # not a drift
    ]
    out = review(rows, [], NOW)
    by_id = {a["id"]: a for a in out["alerts"]}
    assert set(by_id) == {"c1:tools_changed", "c2:reasoning_dropped_by_template", "c3:effort_changed",
                          "c4:effort_changed", "c5:brand_new_cause"}
    tools = by_id["c1:tools_changed"]
    assert tools["count"] == 2 and tools["tokens_lost_total"] == 250_000 and tools["severity"] == "critical"
    assert tools["pages"] and tools["group"] == "actionable" and tools["fixable_by"] == "client"
    assert tools["first_seen"] == NOW - 300 and tools["time"] == NOW - 200
    dropped = by_id["c2:reasoning_dropped_by_template"]
    assert dropped["group"] == "unavoidable" and dropped["severity"] == "critical" and not dropped["pages"]
    repin = by_id["c3:effort_changed"]
    assert repin["group"] == "repin" and repin["title"] == "deliberate re-pin" and not repin["pages"]
    assert by_id["c4:effort_changed"]["pages"] and by_id["c4:effort_changed"]["group"] == "actionable"
    assert by_id["c5:brand_new_cause"]["remedy"] == DEFAULT.remedy
    assert out["counts"]["paging"] == 2 and out["counts"]["unavoidable"] == 1 and out["counts"]["repin"] == 1
    assert [a["id"] for a in out["alerts"][:2]] == ["c1:tools_changed", "c4:effort_changed"]  # paging first
    assert {p["cause"] for p in out["patterns"]} >= {"tools_changed", "effort_changed"}


def test_mute_hides_and_ack_covers_only_what_was_seen() -> None:
    rows = [row("tools_changed", "c1", 50_000, 12.0, ts=NOW - 100, client="opencode"),
            row("tools_changed", "c2", 50_000, 12.0, ts=NOW - 10, client="opencode"),
            row("tools_changed", "c3", 50_000, 12.0, ts=NOW - 10, client="aider")]
    mute = {"id": "m1", "kind": "mute", "lane": "*", "cause": "tools_changed", "client": "aider", "until": NOW + 60,
            "created": NOW - 50}
    ack = {"id": "a1", "kind": "ack", "lane": "dsv41", "cause": "tools_changed", "client": "opencode",
           "until": NOW + 60, "created": NOW - 50}
    out = review(rows, [mute, ack], NOW)
    states = {a["conversation"]: (a["state"], a["pages"]) for a in out["alerts"]}
    assert states == {"c1": ("acknowledged", False), "c2": (None, True)}  # c2 happened after the ack
    assert out["counts"]["muted"] == 1
    assert {a["conversation"] for a in review(rows, [mute, ack], NOW, show="all")["alerts"]} == {"c1", "c2", "c3"}
    expired = {**mute, "until": NOW - 1}
    assert len(review(rows, [expired], NOW)["alerts"]) == 3
    assert rule_matches({"lane": "*", "cause": None, "client": "x"}, "any", "thing", "x")
    assert not rule_matches({"lane": "a", "cause": "*", "client": "*"}, "b", "c", "d")
    assert [a["severity"] for a in review(rows, [], NOW, severity="critical")["alerts"]] == []


def test_client_of_user_agents() -> None:
    assert client_of("opencode/0.5.1 ai-sdk/4.2") == "opencode"
    assert client_of("OpenAI/Python 1.99.0") == "OpenAI/Python"
    assert client_of("claude-cli/2.0.1 (external, cli)") == "claude-cli"
    assert client_of("curl/8.5.0") == "curl"
    assert client_of(None) == "unknown" and client_of("  ") == "unknown"


def test_client_keys_are_hashed_like_the_hot_path() -> None:
    assert candidate_ids("abc") == [key_id("abc")]
    internal = key_id("abc")
    assert candidate_ids(internal)[0] == internal
    assert candidate_ids("  ") == []


# -- through the admin API --------------------------------------------------------------------

@pytest.fixture()
def api(tmp_path: Path):
    app = make_app(routes({"lane-a": lane("http://127.0.0.1:9", engine="sglang", upstream_model="m")},
                          {"public-a": "lane-a"}), tmp_path)
    with TestClient(app) as client:
        gw = app.state.gateway
        records = gw.records
        plan = [("sess-1", "opencode/0.5.1", "tools_changed", 60_000, None),
                ("sess-1", "opencode/0.5.1", "tools_changed", 40_000, None),
                ("sess-2", "aider/0.80 (linux)", "reasoning_dropped_by_template", 30_000, None),
                ("sess-3", "OpenAI/Python 1.99.0", "effort_changed", 20_000, "repinned")]
        for i, (sess, ua, cause, lost, action) in enumerate(plan):
            ex = exchange(request_id=f"d{i}", lane="lane-a", request_headers={"user-agent": ua},
                          conversation_id=key_id(sess), turn=i + 2, effort_action=action)
            ex.cache = CacheVerdict("drift", cause=cause, tokens_lost=lost, seconds_lost=lost / 4000,
                                    divergence_message_index=0, snippet_before="<｜User｜>Today is Monday",
                                    snippet_after="<｜User｜>Today is Tuesday")
            records.sink(ex, None)
        records.db.flush()
        yield client


def test_alerts_api_filters_and_groups(api) -> None:
    out = api.get("/admin/api/alerts").json()
    assert out["source"]["scope"] == "host" and len(out["alerts"]) == 3
    tools = next(a for a in out["alerts"] if a["cause"] == "tools_changed")
    assert tools["count"] == 2 and tools["severity"] == "major" and tools["client"] == "opencode"
    assert tools["snippet_after"] == "<｜User｜>Today is Tuesday"
    assert [a["group"] for a in api.get("/admin/api/alerts", params={"client": "aider"}).json()["alerts"]] == \
        ["unavoidable"]
    assert len(api.get("/admin/api/alerts", params={"user_agent": "Python 1.99"}).json()["alerts"]) == 1
    assert len(api.get("/admin/api/alerts", params={"group": "repin"}).json()["alerts"]) == 1
    assert len(api.get("/admin/api/alerts", params={"tenant": "other"}).json()["alerts"]) == 0
    assert len(api.get("/admin/api/alerts", params={"since": time.time() + 10}).json()["alerts"]) == 0
    mine = api.get("/admin/api/alerts", params={"conversation_key": "sess-1"}).json()["alerts"]
    assert [a["cause"] for a in mine] == ["tools_changed"]
    for bad in ({"severity": "huge"}, {"group": "x"}, {"since": "yesterday"}, {"show": "some"}):
        resp = api.get("/admin/api/alerts", params=bad)
        assert resp.status_code == 400 and resp.json()["error"]["param"] in ("severity", "group", "since", "show")


def test_mute_and_ack_through_the_api(api) -> None:
    rule = api.post("/admin/api/triage", json={"kind": "mute", "lane": "lane-a", "cause": "tools_changed",
                                               "client": "opencode", "expires_in_s": 3600, "note": "fixed in 0.6"})
    assert rule.status_code == 201
    rid = rule.json()["id"]
    out = api.get("/admin/api/alerts").json()
    assert out["counts"]["muted"] == 1 and all(a["cause"] != "tools_changed" for a in out["alerts"])
    assert api.get("/admin/api/triage").json()["rules"][0]["note"] == "fixed in 0.6"
    assert api.delete(f"/admin/api/triage/{rid}").status_code == 200
    assert api.delete(f"/admin/api/triage/{rid}").status_code == 404
    api.post("/admin/api/triage", json={"kind": "ack", "cause": "tools_changed", "expires_in_s": 600})
    tools = next(a for a in api.get("/admin/api/alerts").json()["alerts"] if a["cause"] == "tools_changed")
    assert tools["state"] == "acknowledged" and not tools["pages"]
    for bad in ({"kind": "snooze"}, {"kind": "mute"}, {"kind": "ack", "expires_in_s": -5},
                {"kind": "ack", "expires_in_s": 1e9}, {"kind": "ack", "lane": 3}, {"kind": "ack", "colour": "red"}):
        resp = api.post("/admin/api/triage", json=bad)
        assert resp.status_code == 400, bad
    assert api.post("/admin/api/triage", content=b"[not json").status_code == 400


def test_conversation_timeline_by_client_key(api) -> None:
    conv = api.get("/admin/api/conversations/sess-1").json()
    assert conv["conversation"] == key_id("sess-1") and conv["looked_up_as"] == "sess-1"
    assert [t["turn"] for t in conv["turns"]] == [2, 3] and conv["totals"]["tokens_lost"] == 100_000
    assert conv["turns"][0]["remedy"] and conv["turns"][0]["diff_before"].startswith("<｜User｜>")
    assert api.get(f"/admin/api/conversations/{key_id('sess-1')}").json()["conversation"] == key_id("sess-1")
    assert api.get("/admin/api/conversations/sess-1", params={"tenant": "acme"}).status_code == 404
    assert api.get("/admin/api/conversations/nobody-knows").status_code == 404


def test_patterns_sum_a_clients_cause_over_conversations() -> None:
    rows = [row("tools_changed", f"c{i}", 1_000, 0.25, ts=NOW - 7200 + i * 600, client="opencode") for i in range(6)]
    rows.append(row("tools_changed", "c9", 1_000, 0.25, client="aider"))
    out = review(rows, [], NOW)
    pats = {(p["client"], p["cause"]): p for p in out["patterns"]}
    p = pats[("opencode", "tools_changed")]
    assert p["conversations"] == 6 and p["turns"] == 6 and p["tokens_lost"] == 6_000
    assert p["per_hour"] == 6.0  # six in 50 minutes, counted over at least an hour
    assert p["severity"] == "major"  # six conversations hit by the same client: it keeps costing
    assert pats[("aider", "tools_changed")]["severity"] == "info"
