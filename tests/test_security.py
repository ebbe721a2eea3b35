"""Client and admin keys: units, the app in-process, and the real gateway in front of the emulator.

What must hold: a missing or wrong client key is a 401 in OpenAI's shape before anything else
happens; the admin key guards /admin data, /metrics and state; demo mode says so loudly;
GATEWAY_PRODUCTION=1 refuses to start without keys; no key (client or upstream) is ever logged,
echoed in a response or error, or forwarded from a client to an engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from starlette.testclient import TestClient

from gateway.server.security import KeyRing, SecurityConfigError, digest
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import REPO, free_port, run_gateway
from tests.support.poll import wait_until
from tests.support.inprocess import make_app as app_for
from tests.support.routes import lane

CLIENT_KEY = "sk-client-Zq8v1-4c71d0e2"
CLIENT_KEY_2 = "sk-client-second-77aa"
FILE_KEY = "sk-from-hashed-file-0b5e"
ADMIN_KEY = "admin-key-3f9a0c8e1d2b4a67"
UPSTREAM_KEY = "sk-upstream-engine-9d41c2"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def routes(replica: str = "http://127.0.0.1:9", *, keys: bool = True, admin: bool = True,
           hashed_file: str | None = None, **lane_extra) -> dict:
    gateway: dict = {}
    if keys:
        gateway["client_keys"] = {"env": "TEST_GW_CLIENT_KEYS", **({"hashed_file": hashed_file} if hashed_file else {})}
    if admin:
        gateway["admin_key_env"] = "TEST_GW_ADMIN_KEY"
    keyed = lane(replica, **{"timeouts": {"connect": 1, "first_byte": 5, "idle": 5}, "breaker": {"failures": 1000},
                             **lane_extra})
    return {"gateway": gateway, "lanes": {"a": keyed}, "models": {"public-a": "a"}}


def key_env() -> dict[str, str]:
    return {"TEST_GW_CLIENT_KEYS": f"{CLIENT_KEY}, {CLIENT_KEY_2}", "TEST_GW_ADMIN_KEY": ADMIN_KEY,
            "TEST_UPSTREAM_KEY": UPSTREAM_KEY}


def assert_error_shape(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# -- units -------------------------------------------------------------------------------------------


def test_keyring_matches_only_its_keys() -> None:
    ring = KeyRing([digest("alpha"), digest("beta")])
    assert len(ring) == 2
    assert ring.matches("alpha") and ring.matches("beta")
    assert not ring.matches("alpha ") and not ring.matches("") and not ring.matches("gamma")
    assert not KeyRing([]).matches("alpha")
    with pytest.raises(ValueError):
        KeyRing([b"short"])


def test_keyring_same_bucket_compares_whole_digest() -> None:
    a = digest("alpha")
    twin = a[:8] + bytes(24)  # same bucket, different digest
    ring = KeyRing([twin])
    assert not ring.matches("alpha")
    ring = KeyRing([twin, a])
    assert ring.matches("alpha")


# -- in-process --------------------------------------------------------------------------------------


@pytest.fixture()
def make_app(tmp_path: Path, monkeypatch):
    made = []

    def make(cfg: dict, env: dict[str, str] | None = None, production: bool = False):
        for k, v in (env if env is not None else key_env()).items():
            monkeypatch.setenv(k, v)
        app = app_for(cfg, tmp_path, production=production)
        client = TestClient(app)
        client.__enter__()
        made.append(client)
        return client, app.state.gateway

    yield make
    for c in made:
        c.__exit__(None, None, None)


def test_client_key_required_on_v1(make_app) -> None:
    client, _ = make_app(routes())
    body = {"model": "public-a", "messages": [{"role": "user", "content": "hi"}]}
    for path, method in (("/v1/models", "GET"), ("/v1/models/public-a", "GET"),
                         ("/v1/chat/completions", "POST"), ("/v1/completions", "POST")):
        r = client.request(method, path, json=body if method == "POST" else None)
        err = assert_error_shape(r, 401)
        assert err["code"] == "missing_api_key" and r.headers["www-authenticate"].startswith("Bearer")
        r = client.request(method, path, json=body if method == "POST" else None,
                           headers={"Authorization": "Bearer sk-wrong"})
        assert assert_error_shape(r, 401)["code"] == "invalid_api_key"
        assert "sk-wrong" not in r.text
    for headers in ({"Authorization": f"Bearer {CLIENT_KEY}"}, {"Authorization": f"bearer  {CLIENT_KEY_2} "},
                    {"X-Api-Key": CLIENT_KEY}, {"Api-Key": CLIENT_KEY_2}):
        assert client.get("/v1/models", headers=headers).status_code == 200, headers
    # Not a bearer token: refused, even if the value happens to be a key.
    assert client.get("/v1/models", headers={"Authorization": f"Basic {CLIENT_KEY}"}).status_code == 401
    # The key check comes before the body is even looked at.
    r = client.post("/v1/chat/completions", content=b"{broken", headers={"Authorization": "Bearer nope"})
    assert assert_error_shape(r, 401)["code"] == "invalid_api_key"
    r = client.post("/v1/chat/completions", content=b"{broken", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert assert_error_shape(r, 400)["code"] == "invalid_json"
    # Health endpoints stay open for orchestrators.
    assert client.get("/healthz").status_code == 200


def test_hashed_key_file(make_app, tmp_path: Path) -> None:
    keyfile = tmp_path / "client_keys.sha256"
    keyfile.write_text(f"# clients\n\n{sha(FILE_KEY)}  team-a\n{sha('other-key').upper()}\n")
    client, gw = make_app(routes(hashed_file="client_keys.sha256"))  # relative to routes.yaml
    assert len(gw.security.client_keys) == 4  # 2 from the env, 2 from the file
    for key in (FILE_KEY, "other-key", CLIENT_KEY):
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {sha(FILE_KEY)}"}).status_code == 401


def test_bad_hashed_file_refuses_to_start_without_echoing_it(tmp_path: Path, monkeypatch) -> None:
    keyfile = tmp_path / "keys.txt"
    keyfile.write_text("sk-plaintext-pasted-by-mistake\n")
    monkeypatch.setenv("TEST_GW_ADMIN_KEY", ADMIN_KEY)
    with pytest.raises(SecurityConfigError) as info:
        app_for(routes(hashed_file=str(keyfile)), tmp_path)
    assert "line 1" in str(info.value) and "sk-plaintext" not in str(info.value)


def test_admin_guard(make_app) -> None:
    client, gw = make_app(routes())
    for path in ("/metrics", "/admin/api/overview?probe=0", "/admin/api/records", "/admin/drift"):
        r = client.get(path)
        assert assert_error_shape(r, 401)["code"] == "missing_admin_key", path
        r = client.get(path, headers={"Authorization": "Bearer not-the-admin-key"})
        assert assert_error_shape(r, 401)["code"] == "invalid_admin_key", path
        r = client.get(path, headers={"Authorization": f"Bearer {CLIENT_KEY}"})
        assert assert_error_shape(r, 403)["code"] == "admin_key_required", path
        assert client.get(path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200, path
        assert client.get(path, headers={"X-Admin-Key": ADMIN_KEY}).status_code == 200, path
    # The page shell and its assets carry no data; the page sends the key with each API call.
    assert client.get("/admin").status_code == 200
    assert client.get("/admin/static/admin.js").status_code == 200
    # The admin key is not a client key.
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 401


def test_client_keys_without_admin_key_closes_admin(make_app, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.security"):
        client, _ = make_app(routes(admin=False))
    assert "NO ADMIN KEY" in caplog.text
    r = client.get("/metrics", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert assert_error_shape(r, 403)["code"] == "admin_key_not_configured"


def test_demo_mode_is_open_and_says_so(make_app, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.security"):
        client, gw = make_app(routes(keys=False, admin=False), env={})
    assert "DEMO MODE: NO API KEYS" in caplog.text
    assert gw.security.demo
    assert client.get("/v1/models").status_code == 200
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("cfg_kw,env,missing", [
    ({"keys": False, "admin": False}, {}, ["no client keys", "no admin key"]),
    ({}, {"TEST_GW_ADMIN_KEY": ADMIN_KEY}, ["no client keys"]),  # configured, but the variable is unset
    ({}, {"TEST_GW_CLIENT_KEYS": CLIENT_KEY}, ["no admin key"]),
    ({}, {"TEST_GW_CLIENT_KEYS": CLIENT_KEY, "TEST_GW_ADMIN_KEY": "short"}, ["shorter than 16"]),
])
def test_production_refuses_to_start_without_keys(tmp_path: Path, monkeypatch, cfg_kw, env, missing) -> None:
    for k in ("TEST_GW_CLIENT_KEYS", "TEST_GW_ADMIN_KEY"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SecurityConfigError) as info:
        app_for(routes(**cfg_kw), tmp_path, production=True)
    for m in missing:
        assert m in str(info.value)
    assert CLIENT_KEY not in str(info.value)


def test_production_starts_with_keys(make_app) -> None:
    client, _ = make_app(routes(), production=True)
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"}).status_code == 200


def test_reload_picks_up_new_key_file_and_keeps_old_keys_on_error(make_app, tmp_path: Path) -> None:
    client, gw = make_app(routes())
    auth = {"Authorization": f"Bearer {FILE_KEY}"}
    assert client.get("/v1/models", headers=auth).status_code == 401
    (tmp_path / "k.sha256").write_text(sha(FILE_KEY) + "\n")
    (tmp_path / "routes.yaml").write_text(yaml.safe_dump(routes(hashed_file="k.sha256")))
    assert gw.runtime.reload_from_disk()
    assert client.get("/v1/models", headers=auth).status_code == 200
    # A reload whose key file is unreadable keeps the keys in force.
    (tmp_path / "routes.yaml").write_text(yaml.safe_dump(routes(hashed_file="missing.sha256")))
    assert gw.runtime.reload_from_disk()
    assert client.get("/v1/models", headers=auth).status_code == 200


def test_keys_never_logged(make_app, caplog) -> None:
    with caplog.at_level(logging.DEBUG):
        client, _ = make_app(routes())
        client.get("/v1/models", headers={"Authorization": "Bearer sk-attacker-guess-1"})
        client.get("/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
        client.get("/metrics", headers={"Authorization": "Bearer admin-guess-2"})
        client.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        client.post("/v1/chat/completions", json={"model": "public-a", "messages": [{"role": "user", "content": "x"}]},
                    headers={"Authorization": f"Bearer {CLIENT_KEY}"})  # upstream unreachable: logged as such
    for secret in (CLIENT_KEY, CLIENT_KEY_2, ADMIN_KEY, "sk-attacker-guess-1", "admin-guess-2", UPSTREAM_KEY):
        assert secret not in caplog.text


# -- the real gateway and the emulator -----------------------------------------------------------


@pytest.fixture(scope="module")
def emu():
    with run_emulator(flavour="vllm", output_tokens=6, reasoning_tokens=2) as e:
        yield e


@pytest.fixture(scope="module")
def keyed_gw(emu):
    with run_gateway(routes(emu.url, api_key_env="TEST_UPSTREAM_KEY"), env=key_env()) as g:
        yield g


def test_real_gateway_with_openai_client(keyed_gw) -> None:
    ok = openai.OpenAI(base_url=keyed_gw.base_url, api_key=CLIENT_KEY, max_retries=0, timeout=20)
    r = ok.chat.completions.create(model="public-a", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content
    bad = openai.OpenAI(base_url=keyed_gw.base_url, api_key="sk-nope", max_retries=0, timeout=20)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(model="public-a", messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "invalid_api_key"


def _secrets_absent(text: str) -> None:
    for secret in (CLIENT_KEY, CLIENT_KEY_2, ADMIN_KEY, UPSTREAM_KEY):
        assert secret not in text


def test_client_authorization_never_reaches_the_engine(keyed_gw, emu) -> None:
    """The engine sees the lane's own key, never the client's; neither comes back to the client."""
    body = {"model": "public-a", "messages": [{"role": "user", "content": "hello"}]}
    auth = {"Authorization": f"Bearer {CLIENT_KEY}", "X-Api-Key": CLIENT_KEY_2, "Api-Key": CLIENT_KEY_2,
            "Cookie": f"session={CLIENT_KEY}", "Proxy-Authorization": f"Bearer {CLIENT_KEY}"}
    seen = []
    r = httpx.post(keyed_gw.url + "/v1/chat/completions", json=body, headers=auth, timeout=20)
    assert r.status_code == 200
    seen.append(r)
    headers = emu.stats()["last_headers"]
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert CLIENT_KEY not in json.dumps(headers) and CLIENT_KEY_2 not in json.dumps(headers)
    assert not {"x-api-key", "api-key", "cookie", "proxy-authorization"} & set(headers)

    with httpx.stream("POST", keyed_gw.url + "/v1/chat/completions", json={**body, "stream": True},
                      headers=auth, timeout=20) as s:
        text = s.read().decode()
        assert s.status_code == 200 and "[DONE]" in text
        _secrets_absent(text + json.dumps(dict(s.headers)))
    assert emu.stats()["last_headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"

    # Every kind of refusal and failure: none echoes a key.
    seen.append(httpx.post(keyed_gw.url + "/v1/chat/completions", content=b"{bad", headers=auth))
    seen.append(httpx.post(keyed_gw.url + "/v1/chat/completions", json={**body, "model": "nope"}, headers=auth))
    seen.append(httpx.post(keyed_gw.url + "/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {CLIENT_KEY}x"}))
    seen.append(httpx.get(keyed_gw.url + "/metrics", headers=auth))
    seen.append(httpx.get(keyed_gw.url + "/admin/api/overview", headers={"X-Admin-Key": ADMIN_KEY}))
    seen.append(httpx.get(keyed_gw.url + "/readyz"))
    seen.append(httpx.get(keyed_gw.url + "/openapi.json"))
    emu.configure(fail_rate=1.0)
    try:
        seen.append(httpx.post(keyed_gw.url + "/v1/chat/completions", json=body, headers=auth))
        assert seen[-1].status_code == 502  # the engine's 500
    finally:
        emu.configure(fail_rate=0.0)
    for resp in seen:
        _secrets_absent(resp.text + json.dumps(dict(resp.headers)))
    _secrets_absent(keyed_gw.log())


def test_demo_lane_without_upstream_key_sends_none(emu) -> None:
    with run_gateway(routes(emu.url, keys=False, admin=False)) as g:
        r = httpx.post(g.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {CLIENT_KEY}"},
                       json={"model": "public-a", "messages": [{"role": "user", "content": "hello"}]}, timeout=20)
        assert r.status_code == 200
        assert "authorization" not in emu.stats()["last_headers"]
        log = g.log()
    assert "DEMO MODE: NO API KEYS" in log
    assert CLIENT_KEY not in log


def test_production_process_exits_without_keys(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(routes(keys=False, admin=False)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEST_GW_")}
    env.update(GATEWAY_PRODUCTION="1", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--routes", str(path), "--port",
                           str(free_port()), "--data-dir", str(tmp_path / "data")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "GATEWAY_PRODUCTION=1 refuses to start" in out, out[-2000:]
    assert time.monotonic() - t0 < 60


def test_production_process_serves_with_keys(emu) -> None:
    env = {**key_env(), "GATEWAY_PRODUCTION": "1"}
    with run_gateway(routes(emu.url), env=env) as g:
        assert httpx.get(g.url + "/v1/models").status_code == 401
        assert httpx.get(g.url + "/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"}).status_code == 200
        assert "DEMO MODE" not in g.log()


# -- keys follow their file ----------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # as editors and config managers replace a file


@pytest.mark.parametrize("watch", [True, False], ids=["file-watch", "sighup"])
def test_keys_follow_their_file(emu, tmp_path: Path, watch: bool) -> None:
    keyfile = tmp_path / "keys" / "clients.sha256"  # another folder than routes.yaml's
    keyfile.parent.mkdir()
    keyfile.write_text(f"{sha(FILE_KEY)} team-a\n{sha(CLIENT_KEY_2)} team-b\n")
    env = {**key_env(), "TEST_GW_CLIENT_KEYS": "", "GATEWAY_WATCH_ROUTES": "1" if watch else "0"}
    with run_gateway(routes(emu.url, hashed_file=str(keyfile)), env=env) as g:
        def status(key: str) -> int:
            return httpx.get(g.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code

        def keys_error() -> str | None:
            ready = httpx.get(g.url + "/readyz", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
            return ready["config"]["keys_error"]

        def changed() -> None:
            if not watch:
                g.proc.send_signal(signal.SIGHUP)

        assert status(FILE_KEY) == 200 and status(CLIENT_KEY_2) == 200
        _write_atomic(keyfile, f"{sha(CLIENT_KEY_2)} team-b\n")  # FILE_KEY revoked
        changed()
        wait_until(lambda: status(FILE_KEY) == 401, what="the revoked key refused")
        assert status(CLIENT_KEY_2) == 200
        with httpx.stream("POST", g.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {FILE_KEY}"},
                          json={"model": "public-a", "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}) as resp:
            assert resp.status_code == 401
        _write_atomic(keyfile, "not a digest\n")  # garbage: the last good keys stay, the error is shown
        changed()
        wait_until(lambda: keys_error() is not None, what="the key file's error in /readyz")
        assert "line 1" in keys_error() and "not a digest" not in keys_error()
        assert status(CLIENT_KEY_2) == 200 and status(FILE_KEY) == 401
        keyfile.unlink()  # deleted: the same
        changed()
        wait_until(lambda: "cannot read" in (keys_error() or ""), what="the deleted key file in /readyz")
        assert status(CLIENT_KEY_2) == 200
        _write_atomic(keyfile, f"{sha(FILE_KEY)} team-a\n")  # back, with the other key only
        changed()
        wait_until(lambda: status(FILE_KEY) == 200 and keys_error() is None, what="the new key file in force")
        assert status(CLIENT_KEY_2) == 401
    assert "not a digest" not in g.log_path.read_text()
