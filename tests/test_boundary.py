"""The gateway as a boundary: every route is closed unless declared public, tenants never
meet, and the route table is the one the app really serves."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import httpx
import openai
import pytest

from gateway.server.access import Access
from tests.support.conversations import wait_analysed
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.inprocess import make_app
from tests.support.poll import wait_until
from tests.support.records import recent
from tests.support.routes import emulator_lane, routes

ADMIN_KEY = "boundary-admin-key-0123456789"
KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-0123456789"
ENV = {"BOUNDARY_ADMIN_KEY": ADMIN_KEY}


def _routes(emu_url: str, keyfile: str) -> dict:
    return routes({"ds": emulator_lane(emu_url, render={"template": "deepseek_v4.1"})},
                  client_keys={"hashed_file": keyfile}, admin_key_env="BOUNDARY_ADMIN_KEY")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """One emulator and one keyed gateway whose two client keys belong to tenants team-a and team-b."""
    tmp = tmp_path_factory.mktemp("boundary")
    keyfile = tmp / "keys.sha256"
    keyfile.write_text(f"{hashlib.sha256(KEY_A.encode()).hexdigest()} team-a\n"
                       f"{hashlib.sha256(KEY_B.encode()).hexdigest()} team-b\n")
    with run_emulator(flavour="vllm") as emu:
        cfg = _routes(emu.url, str(keyfile))
        with run_gateway(cfg, env=ENV) as gw:
            yield gw, cfg, tmp


def _table(cfg: dict, tmp: Path, monkeypatch) -> list:
    """The route table the app serves, built in process from the same routes.yaml."""
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    app = make_app(cfg, tmp, name="routes-inproc.yaml", data_dir=tmp / "inproc-data", analysis="thread")
    return app.gateway.endpoints()


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_route_is_closed_unless_declared_public(keyed, monkeypatch) -> None:
    gw, cfg, tmp = keyed
    table = _table(cfg, tmp, monkeypatch)
    served = {(ep.path, m) for ep in table for m in ep.methods}
    assert len(served) >= 20
    client = {"Authorization": f"Bearer {KEY_A}"}
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for ep in table:
        for method in ep.methods:
            url = gw.url + _concrete(ep.path)
            bare = httpx.request(method, url, timeout=10)
            as_client = httpx.request(method, url, headers=client, timeout=10)
            where = f"{method} {ep.path}"
            if ep.access is Access.PUBLIC:
                assert bare.status_code not in (401, 403), where
                continue
            assert bare.status_code == 401, where
            if ep.errors is not None:  # the route's API has its own error shape (Anthropic's)
                assert bare.json()["type"] == "error", where
                assert bare.json()["error"]["type"] == "authentication_error", where
            else:
                assert bare.json()["error"]["code"] in ("missing_api_key", "missing_admin_key"), where
            if ep.access is Access.CLIENT:
                assert as_client.status_code not in (401, 403), where
                continue
            assert as_client.status_code == 403, (where, as_client.text)
            assert httpx.request(method, url, headers=admin, timeout=10).status_code not in (401, 403), where


def test_readyz_details_need_the_admin_key(keyed) -> None:
    gw, _, _ = keyed
    bare = httpx.get(gw.url + "/readyz").json()
    assert set(bare) == {"status"}
    full = httpx.get(gw.url + "/readyz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert {"status", "lanes", "config"} <= set(full)
    as_client = httpx.get(gw.url + "/readyz", headers={"Authorization": f"Bearer {KEY_A}"}).json()
    assert set(as_client) == {"status"}


def _client(gw, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def _turn(gw, key: str, messages: list, **kw):
    raw = _client(gw, key).chat.completions.with_raw_response.create(
        model="ds", messages=messages, max_tokens=16, **kw)  # 8 of them are reasoning
    conv = raw.headers["x-gateway-conversation"]
    cid, turn, via = re.match(r"(\S+); turn=(\d+); via=(\S+)", conv).groups()
    return raw.parse(), cid, int(turn), via, raw.headers.get("x-gateway-effort")


def test_tenants_never_share_a_conversation_pin_or_turn(keyed) -> None:
    gw, _, _ = keyed
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    msgs = [{"role": "user", "content": "Plan the migration."}]
    # The same `user` from two tenants: two conversations, each with its own pin and turn count.
    a1, cid_a, turn_a, _, effort_a = _turn(gw, KEY_A, msgs, user="alice", reasoning_effort="high")
    wait_analysed(gw, cid_a, 1, headers=admin)
    a_msgs = msgs + [{"role": "assistant", "content": a1.choices[0].message.content},
                     {"role": "user", "content": "Go on."}]
    _, cid_a2, turn_a2, _, _ = _turn(gw, KEY_A, a_msgs, user="alice", reasoning_effort="high")
    assert (cid_a2, turn_a2) == (cid_a, 2)
    _, cid_b, turn_b, via_b, effort_b = _turn(gw, KEY_B, msgs, user="alice", reasoning_effort="low")
    assert cid_b != cid_a and turn_b == 1 and via_b == "user"
    assert "pinned" not in (effort_b or ""), "B is not pinned to A's effort"
    # Lineage: B replays A's history (A's exact output as the latest assistant message): a new
    # conversation for B, never A's.
    _, cid_b2, turn_b2, via_b2, _ = _turn(gw, KEY_B, a_msgs)
    # (B's own first answer may equal A's, as the emulator answers the same prompt alike: then B's replay
    # continues B's own conversation, which is right; it never reaches A's.)
    assert cid_b2 != cid_a, (cid_b2, turn_b2, via_b2)
    assert (turn_b2 == 1 and via_b2 in ("new", "lineage_unknown")) or (cid_b2 == cid_b and via_b2 == "lineage")
    # A's own replay without a key does find A's conversation (lineage works within a tenant).
    _, cid_a3, _, via_a3, _ = _turn(gw, KEY_A, a_msgs)
    assert cid_a3 == cid_a and via_a3.startswith("lineage")
    # Records and alerts carry the tenant (an id, never the key) for the admin.
    by_conv = _poll_tenants(gw, admin, {cid_a, cid_b, cid_b2})
    assert by_conv[cid_a] == "team-a" and by_conv[cid_b] == "team-b" and by_conv[cid_b2] == "team-b"
    text = httpx.get(gw.url + "/admin/api/records?limit=50", headers=admin).text
    assert KEY_A not in text and KEY_B not in text


def _poll_tenants(gw, headers: dict, cids: set[str], timeout: float = 30.0) -> dict[str, str]:
    """conversation -> tenant from the records, once every conversation in `cids` has one."""
    def every_one() -> dict[str, str] | None:
        by_conv = {r["conversation"]: r["tenant"] for r in recent(gw, 200, headers) if r["conversation"]}
        return by_conv if cids <= set(by_conv) else None

    return wait_until(every_one, timeout, f"the records of {sorted(cids)}")
