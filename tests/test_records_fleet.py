"""A fleet of gateways sharing one PostgreSQL for records, through real servers on loopback.

- two gateways write to one database; the admin API, `gateway stats` and `gateway drift` of
  either one show both gateways' traffic;
- the database stopped mid-traffic fails no request; records wait in a bounded queue and reach
  the database when it is back; the admin API answers 503 meanwhile, not 500.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import httpx
import pytest

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import REPO, run_gateway
from tests.support.poll import wait_until
from tests.support.postgres_proc import fresh_database, run_private_postgres
from tests.support.records import TOOLS, get_json, post, prompt_of
from tests.support.routes import emulator_lane, routes


def routes_with(emu_url: str, pg_url: str) -> dict[str, Any]:
    return routes({"dsv41-vllm": emulator_lane(emu_url)}, {"agent": "dsv41-vllm"}, records={"postgres": pg_url})


def total_requests(gw_url: str) -> int:
    return get_json(gw_url + "/admin/api/stats?window_s=3600")["total"]["requests"]


def drifting_conversation(gw_url: str, conv: str, ua: str, extra: dict[str, str] | None = None) -> None:
    """Two turns whose system prompt changes in between: one drift alert, cause system_prompt_changed."""
    headers = {"X-Conversation-Id": conv, "User-Agent": ua, **(extra or {})}
    first = [{"role": "system", "content": "You are a careful agent. Today is Monday."},
             {"role": "user", "content": "List the files."}]
    status, body = post(gw_url, {"model": "agent", "messages": first, "tools": TOOLS}, headers)
    assert status == 200
    answer = json.loads(body)["choices"][0]["message"]
    second = [{"role": "system", "content": "You are a careful agent. Today is Tuesday."}, first[1],
              {"role": "assistant", "content": answer.get("content") or "",
               "reasoning_content": answer.get("reasoning_content")},
              {"role": "user", "content": "Now read the first one."}]
    assert post(gw_url, {"model": "agent", "messages": second, "tools": TOOLS}, headers)[0] == 200


def test_two_gateways_share_one_postgres_and_both_show_the_fleet() -> None:
    with fresh_database() as pg_url, \
            run_emulator(flavour="vllm", tokenizer="dsv41", default_thinking=True, reasoning_tokens=4) as emu:
        cfg = routes_with(emu.url, pg_url)
        with run_gateway(cfg) as a, run_gateway(cfg) as b:
            for i in range(3):
                assert post(a.url, {"model": "agent", "messages": prompt_of(i, 30), "max_tokens": 8},
                            {"User-Agent": "opencode/0.5.1"})[0] == 200
            for i in range(2):
                assert post(b.url, {"model": "agent", "messages": prompt_of(10 + i, 30), "max_tokens": 8},
                            {"User-Agent": "OpenAI/Python 1.99.0"})[0] == 200
            drifting_conversation(b.url, "fleet-conv", "claude-cli/2.0.1 (external, cli)")
            wait_until(lambda: total_requests(a.url) == 7, what="gateway a to see all 7 records")
            assert total_requests(b.url) == 7
            stats = get_json(a.url + "/admin/api/stats?window_s=3600")
            assert stats["source"]["scope"] == "fleet" and stats["source"]["backend"] == "postgres"
            recs = get_json(a.url + "/admin/api/records?limit=100")["records"]
            assert len({r["gateway"] for r in recs}) == 2  # both gateways' records, told apart
            # As the docs name it: gateway_records_total{store="postgres", outcome="written"}.
            metrics = httpx.get(a.url + "/metrics").text
            assert 'gateway_records_total{outcome="written",store="postgres"}' in metrics, \
                [line for line in metrics.splitlines() if line.startswith("gateway_records_total")]
            assert {r["client"] for r in recs} == {"opencode", "OpenAI/Python", "claude-cli"}
            only = get_json(a.url + "/admin/api/records?limit=100&client=opencode")["records"]
            assert len(only) == 3
            # The drift that happened on gateway b is listed by gateway a.
            drift = get_json(a.url + "/admin/api/alerts?window_s=3600")
            alert = next(x for x in drift["alerts"] if x["cause"] == "system_prompt_changed")
            assert alert["client"] == "claude-cli" and alert["fixable_by"] == "client" and alert["gateway"]
            assert alert["severity"] in ("critical", "major", "minor", "info") and "system prompt" in alert["remedy"]
            assert alert["snippet_before"] and alert["snippet_after"]
            # ... and the client's own session key finds that conversation on either gateway.
            conv = get_json(a.url + "/admin/api/conversations/fleet-conv")
            assert conv["looked_up_as"] == "fleet-conv" and [t["turn"] for t in conv["turns"]] == [1, 2]
            assert conv["turns"][1]["verdict"] == "drift" and conv["turns"][1]["diff_after"]
            # `gateway drift` of gateway a lists it; a mute set through gateway b applies on a too.
            out = gateway_cli("drift", "--url", a.url, "--since", "3600")
            assert "over the whole fleet" in out and "system_prompt_changed" in out and "→ The client changed" in out
            assert "claude-cli" in out and "PATTERNS" in out
            gateway_cli("drift", "mute", "--url", b.url, "--cause", "system_prompt_changed", "--client", "claude-cli",
                        "--for", "1h", "--note", "told the authors")
            listed = json.loads(gateway_cli("drift", "--url", a.url, "--json"))
            assert (listed["counts"]["muted"] == 1
                    and all(x["cause"] != "system_prompt_changed" for x in listed["alerts"]))
            assert "told the authors" in gateway_cli("drift", "rules", "--url", a.url)
            timeline = gateway_cli("drift", "conversation", "fleet-conv", "--url", a.url)
            assert "client key 'fleet-conv'" in timeline and "system_prompt_changed" in timeline
            # `gateway stats` reads the fleet from routes.yaml's database, and from either gateway.
            out = subprocess.run([sys.executable, "-m", "gateway.cli", "stats", "--routes", str(a.routes_path)],
                                 cwd=REPO, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert "dsv41-vllm" in out.stdout and " 7 " in out.stdout and "every gateway writing to" in out.stdout
            assert "prefill lost:" in out.stdout and "claude-cli" in out.stdout  # who is costing us prefill
            out = subprocess.run([sys.executable, "-m", "gateway.cli", "stats", "--url", b.url, "--json"],
                                 cwd=REPO, capture_output=True, text=True, timeout=60)
            assert json.loads(out.stdout)["total"]["requests"] == 7


def test_database_stopped_mid_traffic_fails_no_request() -> None:
    with run_private_postgres() as pg, \
            run_emulator(flavour="vllm", tokenizer="dsv41", default_thinking=True, reasoning_tokens=4) as emu:
        with run_gateway(routes_with(emu.url, pg.url)) as gw:
            statuses = [post(gw.url, {"model": "agent", "messages": prompt_of(i, 30), "max_tokens": 8})[0]
                        for i in range(3)]
            # Records are written in batches (every 0.2 s), just after the answers.
            wait_until(lambda: _total_or_zero(gw.url) == 3, what="the first records")
            pg.stop()
            statuses += [post(gw.url, {"model": "agent", "messages": prompt_of(100 + i, 30), "max_tokens": 8,
                                       "stream": i % 2 == 0})[0] for i in range(12)]
            assert statuses == [200] * 15  # the database being down never fails a request
            ov = wait_until(lambda: (o := get_json(gw.url + "/admin/api/overview?probe=0"))["records"]["source"][
                "queued"] == 12 and not o["records"]["source"]["connected"] and o, what="records to queue")
            assert ov["records"]["postgres_dropped"] == 0 and ov["records"]["postgres_errors"] >= 1
            with pytest.raises(urllib.error.HTTPError) as err:
                get_json(gw.url + "/admin/api/stats?window_s=3600")
            assert err.value.code == 503
            assert json.loads(err.value.read())["error"]["code"] == "records_unavailable"
            pg.start()
            wait_until(lambda: _total_or_zero(gw.url) == 15, what="the queued records to reach the database")
            ov = get_json(gw.url + "/admin/api/overview?probe=0")
            assert ov["records"]["source"]["connected"] and ov["records"]["source"]["queued"] == 0
            assert "records database" in gw.log()  # said once that it failed (and that it came back)


def gateway_cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _total_or_zero(url: str) -> int:
    try:
        return total_requests(url)
    except urllib.error.HTTPError:
        return 0


def admin_get(url: str, key: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


def test_client_keys_are_looked_up_within_their_tenant(tmp_path) -> None:
    keys = tmp_path / "client_keys.sha256"
    keys.write_text("".join(f"{hashlib.sha256(k.encode()).hexdigest()} {t}\n"
                            for k, t in (("key-a", "team-a"), ("key-b", "team-b"))))
    with run_emulator(flavour="vllm", tokenizer="dsv41", default_thinking=True, reasoning_tokens=4) as emu:
        keyed = routes({"dsv41-vllm": emulator_lane(emu.url)}, {"agent": "dsv41-vllm"},
                       client_keys={"hashed_file": str(keys)}, admin_key_env="TEST_REVIEW_ADMIN")
        with run_gateway(keyed, env={"TEST_REVIEW_ADMIN": "adm"}) as gw:
            # Two tenants name their sessions the same: two conversations, each found only in its tenant.
            drifting_conversation(gw.url, "shared-session", "opencode/0.5.1", {"Authorization": "Bearer key-a"})
            drifting_conversation(gw.url, "shared-session", "aider/0.80", {"Authorization": "Bearer key-b"})
            base = gw.url + "/admin/api"
            wait_until(lambda: admin_get(base + "/stats?window_s=3600", "adm")["total"]["requests"] == 4,
                     what="4 records")
            a = admin_get(base + "/conversations/shared-session?tenant=team-a", "adm")
            b = admin_get(base + "/conversations/shared-session?tenant=team-b", "adm")
            assert a["tenant"] == "team-a" and b["tenant"] == "team-b" and a["conversation"] != b["conversation"]
            assert a["client"] == "opencode" and len(a["turns"]) == 2 and a["looked_up_as"] == "shared-session"
            with pytest.raises(urllib.error.HTTPError) as err:  # no such session in the default tenant
                admin_get(base + "/conversations/shared-session", "adm")
            assert err.value.code == 404
            only_b = admin_get(base + "/alerts?tenant=team-b", "adm")["alerts"]
            assert [x["tenant"] for x in only_b] == ["team-b"] and only_b[0]["client"] == "aider"
            mine = admin_get(base + "/alerts?conversation_key=shared-session&tenant=team-a", "adm")["alerts"]
            assert [x["conversation"] for x in mine] == [a["conversation"]]
            with pytest.raises(urllib.error.HTTPError) as err:  # a client key is not an admin key
                admin_get(base + "/alerts", "key-a")
            assert err.value.code == 403
            out = gateway_cli("drift", "--url", gw.url, "--key", "adm", "--session", "shared-session",
                              "--tenant", "team-a")
            assert a["conversation"] in out and b["conversation"] not in out
