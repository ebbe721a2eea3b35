"""Hostile input (and the protocol findings): record ids that are paths, static
names that are not files, half-sent requests, roles no template renders, trailing slashes and
garbage on the wire. Each is a clear 4xx in OpenAI's shape, never a 500, a hang or a file written.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from gateway.qualify.records import DirStore, InvalidRecordId
from tests.support.gateway_proc import run_gateway
from tests.support.scripted_upstream import Script, http_response, scripted_upstream
from tests.support.routes import lane, routes

ADMIN = "inputs-tests-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}", "X-Gateway-Qualify": ADMIN}
DEADLINE_S = 1.0


# -- record ids (unit: the store itself) -----------------------------------------------------------

BAD_IDS = ["/tmp/evil", "../evil/x", "lane/../../evil", "lane/x/y", ".hidden/x", "lane/.x", "lane\\x/y",
           "lane", "lane/", "/", "lane/x\x00y", "l" * 200 + "/x"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_record_id_that_is_a_path_is_refused(tmp_path: Path, bad: str) -> None:
    store = DirStore(tmp_path / "records")
    with pytest.raises(InvalidRecordId):
        store.save({"id": bad, "lane": "l", "config_hash": "c"})
    assert store.load(bad) is None
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_a_symlinked_lane_folder_cannot_lead_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.json").write_text('{"secret": 1}')
    root = tmp_path / "records"
    root.mkdir()
    (root / "lane").symlink_to(outside, target_is_directory=True)
    store = DirStore(root)
    assert store.load("lane/x") is None
    with pytest.raises(InvalidRecordId):
        store.save({"id": "lane/y", "lane": "lane", "config_hash": "c"})
    assert sorted(p.name for p in outside.iterdir()) == ["x.json"]


def test_a_good_record_id_round_trips(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    rid = store.save({"lane": "dsv4.1", "config_hash": "c", "identity_hash": "ab" * 16, "at_unix": 1.5e9})
    assert store.load(rid)["lane"] == "dsv4.1"


# -- through the gateway ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def upstream():
    with scripted_upstream() as up:
        yield up


@pytest.fixture(scope="module")
def gateway(upstream, tmp_path_factory):
    records = tmp_path_factory.mktemp("qualifications")
    cfg = routes({"l": lane(upstream.url, upstream_model="m", timeouts={"connect": 1, "first_byte": 5, "idle": 2})},
                 {"m": "l"}, admin_key_env="INPUTS_ADMIN_KEY",
                 http={"header_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S},
                 cors={"allow_origins": ["https://app.example"]})
    env = {"INPUTS_ADMIN_KEY": ADMIN, "GATEWAY_QUALIFICATIONS": str(records)}
    with run_gateway(cfg, env=env) as gw:
        gw.records_dir = records  # type: ignore[attr-defined]
        yield gw


@pytest.fixture(scope="module")
def client(gateway):
    with httpx.Client(base_url=gateway.url, timeout=15) as c:
        yield c


def _is_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def test_record_routes_refuse_path_ids(client, gateway, tmp_path: Path) -> None:
    target = tmp_path / "evil"
    for rid in (str(target), "../../" + target.name, "lane/../../x"):
        resp = client.post("/qualify/records", headers=AUTH,
                           json={"id": rid, "lane": "l", "config_hash": "c"})
        _is_openai_error(resp, 400, "invalid_record")
    assert not target.with_suffix(".json").exists() and not list(tmp_path.iterdir())
    for rid in ("/etc/passwd", "../../etc/passwd", "/etc/hostname"):
        _is_openai_error(client.get("/qualify/records", params={"id": rid}, headers=AUTH), 400, "invalid_record_id")
    resp = client.post("/qualify/records", headers=AUTH,
                       json={"lane": "l", "config_hash": "c", "identity_hash": "ab" * 16, "at_unix": time.time()})
    assert resp.status_code == 200, resp.text
    rid = resp.json()["id"]
    assert (gateway.records_dir / (rid + ".json")).is_file()
    assert client.get("/qualify/records", params={"id": rid}, headers=AUTH).json()["id"] == rid


def test_records_are_kept_only_for_served_lanes_and_never_overwritten(client, gateway) -> None:
    good = {"lane": "l", "config_hash": "c", "identity_hash": "cd" * 16, "at_unix": time.time()}
    _is_openai_error(client.post("/qualify/records", headers=AUTH, json={**good, "lane": "no-such-lane"}),
                     404, "lane_not_found")
    _is_openai_error(client.post("/qualify/records", headers=AUTH, json={**good, "id": "other/20260101-x"}),
                     400, "invalid_record")
    first = client.post("/qualify/records", headers=AUTH, json={**good, "id": "l/kept-once"})
    assert first.status_code == 200, first.text
    kept = client.get("/qualify/records", params={"id": "l/kept-once"}, headers=AUTH).json()
    again = client.post("/qualify/records", headers=AUTH, json={**good, "id": "l/kept-once", "config_hash": "x"})
    _is_openai_error(again, 409, "record_exists")
    assert client.get("/qualify/records", params={"id": "l/kept-once"}, headers=AUTH).json() == kept


def test_admin_static_files_come_from_a_fixed_list(client) -> None:
    _is_openai_error(client.get("/admin/static/" + "a" * 300 + ".js", headers=AUTH), 404, "not_found")
    for name in ("index.html", "..%2f..%2fconfig.py", ".hidden.js", "feature.py"):
        _is_openai_error(client.get("/admin/static/" + name, headers=AUTH), 404)
    resp = client.get("/admin/static/admin.js", headers=AUTH)
    assert resp.status_code == 200 and resp.headers["x-content-type-options"] == "nosniff"


def test_admin_page_sends_csp_and_frame_options(client) -> None:
    resp = client.get("/admin", headers=AUTH)
    assert resp.status_code == 200
    csp = resp.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "default-src 'none'" in csp
    assert resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_a_role_no_template_renders_is_a_400(client, upstream) -> None:
    upstream.requests.clear()
    body = {"model": "m", "messages": [{"role": "user", "content": "a"},
                                       {"role": "function", "name": "f", "content": "x"}]}
    err = _is_openai_error(client.post("/v1/chat/completions", json=body), 400, "invalid_value")
    assert err["param"] == "messages[1].role"
    assert not upstream.requests  # refused before the upstream was asked


def test_a_trailing_slash_is_a_json_404_not_an_empty_redirect(client) -> None:
    err = _is_openai_error(client.post("/v1/chat/completions/", json={}), 404, "not_found")
    assert "/v1/chat/completions" in err["message"]
    _is_openai_error(client.get("/healthz/"), 404)


def _raw(gateway, data: bytes, read_timeout: float = 10.0) -> tuple[bytes, float]:
    """Send bytes, read until the gateway closes; (what it answered, seconds until it closed)."""
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        t0 = time.monotonic()
        if data:
            sock.sendall(data)
        out = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            out += chunk
        return out, time.monotonic() - t0


def _json_of(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


def test_malformed_http_is_a_json_400(gateway) -> None:
    raw, _ = _raw(gateway, b"GARBAGE \x00\x01 nonsense\r\n\r\n")
    status, body = _json_of(raw)
    assert status == 400 and body["error"]["code"] == "invalid_http_request"


def test_a_malformed_request_pipelined_behind_a_good_one_is_answered_after_it(gateway, upstream) -> None:
    """The good request was forwarded: its answer reaches the client first, then the 400, then the close."""
    upstream.script = Script([http_response(200, json.dumps({"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "first"}, "finish_reason": "stop"}]}).encode(),
        [("Content-Type", "application/json")])])
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]}).encode()
    good = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    raw, _ = _raw(gateway, good + b"GARBAGE \x00\x01 nonsense\r\n\r\n")
    first, _, rest = raw.partition(b"HTTP/1.1 400")
    assert first.startswith(b"HTTP/1.1 200") and b'"first"' in first, raw[:400]
    assert rest and b"invalid_http_request" in rest, raw[-300:]


def test_half_sent_requests_are_answered_408_and_released(gateway, client) -> None:
    """Within the deadline (1 s here) and its margin: headers cut short, a body shorter than its
    Content-Length, and a connection that says nothing. A complete request meanwhile is the control."""
    t0 = time.monotonic()
    assert client.get("/healthz").status_code == 200
    control = time.monotonic() - t0
    head_cut, t_head = _raw(gateway, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    body_cut, t_body = _raw(gateway, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
    silent, t_silent = _raw(gateway, b"")
    for raw, took in ((head_cut, t_head), (body_cut, t_body), (silent, t_silent)):
        assert DEADLINE_S * 0.8 <= took <= DEADLINE_S + max(5.0, 20 * control), (took, control)
        if raw is silent:
            assert raw == b""  # nothing was asked: closed without an unsolicited answer
            continue
        status, body = _json_of(raw)
        assert status == 408 and body["error"]["code"] == "request_timeout"


def test_many_half_sent_connections_do_not_stop_the_gateway(gateway, client) -> None:
    host, port = gateway.url.removeprefix("http://").split(":")
    socks = []
    try:
        for i in range(200):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{" if i % 2 else b"GET /he")
            socks.append(s)
        assert client.get("/healthz").status_code == 200  # served while they hang
        deadline = time.monotonic() + DEADLINE_S + 15
        for s in socks:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            assert b" 408 " in data.split(b"\r\n", 1)[0], data[:100]
    finally:
        for s in socks:
            s.close()


def test_cors_allow_list(client, upstream) -> None:
    pre = client.options("/v1/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-credentials" not in pre.headers
    other = client.options("/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers
    upstream.script = Script([http_response(200, json.dumps({"choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}).encode(),
        [("Content-Type", "application/json")])])
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}]}
    ok = client.post("/v1/chat/completions", json=body, headers={"Origin": "https://app.example"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
    evil = client.post("/v1/chat/completions", json=body, headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in evil.headers
    assert "access-control-allow-origin" not in client.get("/healthz").headers


def test_the_gateway_logged_no_traceback(gateway) -> None:
    assert "Traceback" not in gateway.log(), gateway.log()[-3000:]

