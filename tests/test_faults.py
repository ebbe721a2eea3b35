"""Faults under load, through real processes: the gateway, emulated engines, Redis, routes.yaml.

Each test is bounded in time (a few seconds of traffic). What must hold:
- an engine killed mid-stream: that client gets an error event and the end of the stream, the
  record says so, streams on other engines carry on untouched;
- an engine stalling before its first byte: 504 within the lane's first-byte timeout;
- one of two replicas down: zero failed requests (failover before the first byte), and the
  replica rejoins through its half-open breaker when it comes back;
- every replica's breaker open: 503 at once, not a timeout; half-open lets exactly one probe through;
- Redis stopped and started again during traffic: zero failed requests;
- routes.yaml replaced by broken files during traffic: the old config keeps serving;
- a client that disconnects: the engine sees the cancellation within 100 ms.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest

from gateway.upstream.replicas import Upstream
from tests.support.emulator_proc import run_emulator
from tests.support.redis_proc import run_redis
from tests.support.gateway_proc import free_port, run_gateway
from tests.support.poll import until, wait_until
from tests.support.records import record_of
from tests.support.routes import lane as base_lane
from tests.support.routes import lane_config
from tests.support.routes import routes as base_routes

ADMIN = "fault-tests-admin-key-0123456789"


def lane(urls: str | list[str], **extra) -> dict:
    return base_lane(urls, **{"timeouts": {"connect": 1, "first_byte": 5, "idle": 5}, **extra})


def routes(lanes: dict, models: dict) -> dict:
    """With an admin key: the tests read replicas' health and records through the admin API."""
    return base_routes(lanes, models, admin_key_env="FAULT_ADMIN_KEY")


ENV = {"FAULT_ADMIN_KEY": ADMIN}


def body(model: str, stream: bool, max_tokens: int = 8, content: str = "Hello there") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": stream}


def data_events(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def outcome(resp_status: int, text: str, stream: bool) -> str:
    """'ok', or what went wrong."""
    if resp_status != 200:
        return f"http {resp_status}: {text[:200]}"
    if not stream:
        try:
            return "ok" if json.loads(text)["choices"] else "no choices"
        except (ValueError, KeyError):
            return f"bad body: {text[:200]}"
    events = data_events(text)
    if not events or events[-1] != "[DONE]":
        return "stream without [DONE]"
    for e in events[:-1]:
        if '"error"' in e and "error" in json.loads(e):
            return f"error event: {e[:200]}"
    return "ok"


@dataclass
class Load:
    """Worker threads sending mixed streaming/non-streaming requests until stopped."""

    url: str
    model: str
    workers: int = 12
    max_tokens: int = 8
    outcomes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _worker(self, n: int) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                stream = (i + n) % 2 == 0
                i += 1
                payload = body(self.model, stream, self.max_tokens, f"worker {n} request {i}")
                t0 = time.monotonic()
                try:
                    r = client.post(self.url + "/v1/chat/completions", json=payload)
                    result = outcome(r.status_code, r.text, stream)
                except httpx.HTTPError as exc:
                    result = f"client error {type(exc).__name__}: {exc}"
                with self._lock:
                    self.outcomes["ok" if result == "ok" else "failed"] += 1
                    if result != "ok":
                        self.failures.append(f"{time.monotonic() - t0:.2f}s {result}")

    def __enter__(self) -> "Load":
        for n in range(self.workers):
            t = threading.Thread(target=self._worker, args=(n,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """No new requests; returns once every worker's last one has ended."""
        self._stop.set()
        for t in self._threads:
            t.join(40)

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


def admin_get(gw, path: str) -> dict:
    r = httpx.get(gw.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_record(gw, request_id: str) -> dict:
    return record_of(gw, request_id, headers={"Authorization": f"Bearer {ADMIN}"})


def replica_health(gw) -> dict[str, dict]:
    """URL -> the replica's breaker state, as GET /admin/api/health shows it (computed when read)."""
    return {r["url"]: r for r in admin_get(gw, "/admin/api/health")["lanes"]["l"]}


# -- the breaker, without processes ---------------------------------------------------------------


def _upstream(failures: int = 2, cool_down_s: float = 0.05) -> Upstream:
    return Upstream.for_lane(lane_config(breaker={"failures": failures, "cool_down_s": cool_down_s}))


def test_breaker_opens_half_opens_with_one_probe_and_closes() -> None:
    up = _upstream()
    rep = up.replicas[0]
    now = time.monotonic()
    assert rep.state(now) == "closed" and rep.acquire(now) and rep.acquire(now)
    up.record_failure(rep, "x")
    assert rep.state(time.monotonic()) == "closed"
    up.record_failure(rep, "x")
    assert rep.state(time.monotonic()) == "open" and not rep.available(time.monotonic())
    assert not rep.acquire(time.monotonic()) and rep.opened == 1
    wait_until(lambda: rep.state(time.monotonic()) == "half_open", what="the cool-down to end", interval=0.005)
    now = time.monotonic()
    assert rep.state(now) == "half_open" and rep.available(now)
    assert rep.acquire(now)  # the probe
    assert not rep.acquire(now) and not rep.available(now) and rep.state(now) == "open"
    up.record_failure(rep, "probe failed")  # one failed probe re-opens at once
    assert rep.state(time.monotonic()) == "open" and not rep.probing and rep.opened == 2
    wait_until(lambda: rep.state(time.monotonic()) == "half_open", what="the cool-down to end", interval=0.005)
    assert rep.acquire(time.monotonic())
    up.record_success(rep)
    assert rep.state(time.monotonic()) == "closed" and rep.consecutive_failures == 0
    assert rep.acquire(time.monotonic()) and rep.acquire(time.monotonic())


def test_active_probe_pass_only_shortens_the_cool_down() -> None:
    up = _upstream(failures=1, cool_down_s=60)
    rep = up.replicas[0]
    up.probe_passed(rep)
    assert rep.state(time.monotonic()) == "closed"
    up.record_failure(rep, "x")
    assert rep.state(time.monotonic()) == "open"
    up.probe_passed(rep)
    assert rep.state(time.monotonic()) == "half_open"  # a real request decides; the probe never closes it


# -- faults through real processes ---------------------------------------------------------------


def test_engine_killed_midstream_others_unaffected() -> None:
    with run_emulator(flavour="vllm", decode_tps=40) as doomed, run_emulator(flavour="vllm", decode_tps=40) as other:
        cfg = routes({"a": lane(doomed.url), "b": lane(other.url)}, {"ma": "a", "mb": "b"})
        with run_gateway(cfg, env=ENV) as gw:
            results: dict[str, str] = {}

            def run(name: str, model: str, n: int) -> None:
                with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body(model, True, n),
                                  headers={"X-Request-Id": name}, timeout=30) as r:
                    results[name] = r.read().decode()
                    results[name + ".status"] = str(r.status_code)

            threads = [threading.Thread(target=run, args=("doomed-1", "ma", 200))]
            threads += [threading.Thread(target=run, args=(f"other-{i}", "mb", 60)) for i in range(3)]
            for t in threads:
                t.start()
            wait_until(lambda: any(r.get("chunks_sent", 0) >= 3 for r in doomed.stats()["recent"]),
                       what="the doomed stream under way", interval=0.02)
            doomed.proc.send_signal(signal.SIGKILL)
            for t in threads:
                t.join(30)
            assert not any(t.is_alive() for t in threads)

            events = data_events(results["doomed-1"])
            assert results["doomed-1.status"] == "200"
            assert events[-1] == "[DONE]", events[-3:]
            err = json.loads(events[-2])["error"]
            assert err["code"] == "upstream_disconnected" and set(err) >= {"message", "type", "code"}
            assert len(events) > 3, "the stream was under way when the engine died"
            for i in range(3):
                assert outcome(200, results[f"other-{i}"], True) == "ok"
                assert len(data_events(results[f"other-{i}"])) > 10

            rec = wait_record(gw, "doomed-1")
            assert rec["error_code"] == "upstream_disconnected" and rec["status"] == 502
            assert not rec["cancelled"]
            for i in range(3):
                other_rec = wait_record(gw, f"other-{i}")
                assert other_rec["error_code"] is None and other_rec["status"] == 200


@pytest.mark.parametrize("stream", [True, False])
def test_stall_before_first_byte_is_504_within_the_timeout(stream: bool) -> None:
    first_byte = 1.0
    with run_emulator(flavour="vllm", stall_before_first_byte_s=8) as emu:
        cfg = routes({"a": lane(emu.url, timeouts={"connect": 1, "first_byte": first_byte, "idle": 5})}, {"m": "a"})
        with run_gateway(cfg, env=ENV) as gw:
            for _ in range(2):
                t0 = time.monotonic()
                r = httpx.post(gw.url + "/v1/chat/completions", json=body("m", stream), timeout=20)
                took = time.monotonic() - t0
                assert r.status_code == 504, r.text
                assert r.json()["error"]["code"] == "upstream_timeout"
                # At the timeout, not at the end of the 8 s stall (a tighter upper bound would
                # measure the machine's load, not the gateway).
                assert first_byte <= took < 4, took


def test_one_of_two_replicas_down_zero_failures_and_rejoin() -> None:
    port_b = free_port()
    with run_emulator(flavour="vllm", decode_tps=400) as a:
        with run_emulator(flavour="vllm", decode_tps=400, port=port_b):
            pass  # B came up once and is gone now: the gateway will find out the hard way
        cfg = routes({"l": lane([a.url, f"http://127.0.0.1:{port_b}"], routing="round_robin",
                                breaker={"failures": 2, "cool_down_s": 0.5})}, {"m": "l"})
        with run_gateway(cfg, env=ENV) as gw:
            with Load(gw.url, "m", workers=12) as load:
                time.sleep(2.5)  # the scenario: traffic with B down for a while (its breaker opens and cools)
                with run_emulator(flavour="vllm", decode_tps=400, port=port_b) as b:
                    # B rejoins: half-open probe, then closed, then its share of the traffic.
                    wait_until(lambda: b.stats()["requests"] > 20, what="replica B to rejoin once it came back")
                    served_by_b = b.stats()["requests"]
                    before_stop = load.total
                    load.stop()
            assert load.failures == [], load.failures[:5]
            assert before_stop > 100, load.outcomes
            assert served_by_b > 20
            ov = admin_get(gw, "/admin/api/overview?probe=0")
            reps = {r["url"]: r for r in ov["lanes"][0]["replicas"]}
            assert reps[f"http://127.0.0.1:{port_b}"]["failures"] >= 2


def test_all_replicas_open_answers_503_at_once() -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    cfg = routes({"l": lane(dead, breaker={"failures": 1, "cool_down_s": 30})}, {"m": "l"})
    with run_gateway(cfg, env=ENV) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=body("m", False), timeout=10)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unavailable"
        before = admin_get(gw, "/admin/api/overview?probe=0")["lanes"][0]["replicas"]
        for stream in (False, True):
            r = httpx.post(gw.url + "/v1/chat/completions", json=body("m", stream), timeout=10)
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["code"] == "no_healthy_replica" and set(err) == {"message", "type", "param", "code"}
        ov = admin_get(gw, "/admin/api/overview?probe=0")
        assert all(rep["breaker_open"] for rep in ov["lanes"][0]["replicas"])
        # "At once": no replica was even tried (a wall-clock bound would fail on a busy machine).
        assert [(x["requests"], x["failures"]) for x in ov["lanes"][0]["replicas"]] == \
            [(x["requests"], x["failures"]) for x in before]


def test_half_open_lets_exactly_one_probe_through() -> None:
    with run_emulator(flavour="vllm") as emu:
        cfg = routes({"l": lane(emu.url, breaker={"failures": 1, "cool_down_s": 2.0})}, {"m": "l"})
        with run_gateway(cfg, env=ENV) as gw:
            url = gw.url + "/v1/chat/completions"
            emu.configure(fail_rate=1.0)
            assert httpx.post(url, json=body("m", False)).status_code == 502  # engine 500; opens the breaker
            emu.configure(fail_rate=0.0, stall_before_first_byte_s=3.0)
            r = httpx.post(url, json=body("m", False))
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
            wait_until(lambda: replica_health(gw)[emu.url]["state"] == "half_open", what="the cool-down to end")
            before = emu.stats()["requests"]
            probe: dict = {}
            t = threading.Thread(target=lambda: probe.update(r=httpx.post(url, json=body("m", False), timeout=20)))
            t.start()
            # Until the probe reached the engine (which stalls 3 s, so it is still in flight).
            wait_until(lambda: emu.stats()["requests"] > before, what="the probe at the engine", interval=0.02)
            for _ in range(3):
                r = httpx.post(url, json=body("m", False))
                assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_replica"
            t.join(10)
            assert probe["r"].status_code == 200
            assert emu.stats()["requests"] - before == 1, "only the probe reached the engine"
            emu.configure(stall_before_first_byte_s=0)
            for _ in range(3):  # closed again
                assert httpx.post(url, json=body("m", False)).status_code == 200


def test_active_probe_finds_a_dead_replica_before_traffic_does() -> None:
    port_b = free_port()
    with run_emulator(flavour="vllm") as a:
        cfg = routes({"l": lane([f"http://127.0.0.1:{port_b}", a.url], routing="round_robin",
                                breaker={"failures": 2, "cool_down_s": 0.3, "probe_interval_s": 0.1,
                                         "probe_path": "/health"})}, {"m": "l"})
        with run_gateway(cfg, env=ENV) as gw:
            dead = f"http://127.0.0.1:{port_b}"

            def replica(url: str) -> dict:
                ov = admin_get(gw, "/admin/api/overview?probe=0")
                return {r["url"]: r for r in ov["lanes"][0]["replicas"]}[url]

            wait_until(lambda: replica(dead)["breaker_open"], what="the active probe to open the dead one's breaker")
            assert "health probe /health" in replica(dead)["last_error"]
            for i in range(6):
                r = httpx.post(gw.url + "/v1/chat/completions", json=body("m", False),
                               headers={"X-Request-Id": f"probe-test-{i}"})
                assert r.status_code == 200
            assert wait_record(gw, "probe-test-5")["retries"] == 0, "no request paid for the dead replica"
            with run_emulator(flavour="vllm", port=port_b) as b:
                wait_until(lambda: not replica(dead)["breaker_open"], what="a passed probe to end the cool-down")
                for _ in range(6):
                    assert httpx.post(gw.url + "/v1/chat/completions", json=body("m", False)).status_code == 200
                assert b.stats()["requests"] >= 2


def _redis(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
                          capture_output=True, text=True, timeout=10)


def _redis_up(port: int) -> bool:
    try:
        return _redis(port, "ping").stdout.strip() == "PONG"
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_redis_stopped_and_restarted_during_traffic() -> None:
    """The gateway's own Redis (started here, never the machine's) goes away under traffic and comes back."""
    with run_redis() as port, run_emulator(flavour="vllm", decode_tps=400) as emu:
        cfg = routes({"l": lane(emu.url)}, {"m": "l"})
        with run_gateway(cfg, env={**ENV, "GATEWAY_REDIS_URL": f"redis://127.0.0.1:{port}/0"}) as gw:
            with Load(gw.url, "m", workers=12) as load:
                time.sleep(1.5)  # the scenario: traffic with Redis up
                at_stop = load.total
                _redis(port, "shutdown", "nosave")
                wait_until(lambda: not _redis_up(port), what="Redis to go away", interval=0.02)
                time.sleep(2.0)  # the scenario: traffic while Redis is away
                during = load.total - at_stop
                with run_redis(port):  # back on the same port
                    assert _redis_up(port)
                    time.sleep(2.0)  # the scenario: traffic once Redis is back
                    load.stop()
            assert load.failures == [], load.failures[:5]
            assert during > 50, "traffic went on while Redis was away"
            assert load.total > 150
            log = gw.log()
            assert "redis unavailable" in log


def test_a_stalled_redis_does_not_hold_answers() -> None:
    """Redis takes no writes for 6 s (CLIENT PAUSE WRITE; reads go on): the head written before an
    answer's last bytes waits at most its bound (the Redis client's timeout, the write's own), then the
    answer ends; requests sent with Redis answering are the control."""
    with run_redis() as port, run_emulator(flavour="vllm", decode_tps=2000) as emu:
        cfg = routes({"l": lane(emu.url)}, {"m": "l"})
        with run_gateway(cfg, env={**ENV, "GATEWAY_REDIS_URL": f"redis://127.0.0.1:{port}/0"}) as gw:
            body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

            def timed(stream: bool) -> float:
                t0 = time.perf_counter()
                r = httpx.post(gw.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=30)
                assert r.status_code == 200, r.text
                return time.perf_counter() - t0

            control = max(timed(False), timed(True))
            assert _redis(port, "client", "pause", "6000", "write").stdout.strip() == "OK"
            paused = [timed(False), timed(True)]
            assert all(t < control + 3.0 for t in paused), (control, paused)
            _redis(port, "client", "unpause")


BROKEN_ROUTES = [
    "lanes: {l: {replicas: [not-a-url]}}\nmodels: {m: l}\n",
    "lanes: [\n  unclosed",
    "",
    "\x00\xff binary junk \x01",
    "lanes: {}\nmodels: {m: l}\n",
    "gateway: {surprise: 1}\nlanes: {l: {replicas: ['http://127.0.0.1:1'], upstream_model: x}}\nmodels: {m: l}\n",
    "lanes: {l: {replicas: ['http://127.0.0.1:1'], upstream_model: x}}\nmodels: {m: nowhere}\n",
]


def test_broken_routes_during_traffic_keep_the_old_config() -> None:
    with run_emulator(flavour="vllm", decode_tps=400) as emu:
        cfg = routes({"l": lane(emu.url)}, {"m": "l"})
        with run_gateway(cfg, env=ENV) as gw:
            with Load(gw.url, "m", workers=8) as load:
                time.sleep(0.8)  # the scenario: traffic on the good config first
                version = admin_get(gw, "/readyz")["config"]["version"]
                for text in BROKEN_ROUTES:
                    tried = admin_get(gw, "/readyz")["config"]["last_reload_at"]
                    gw.write_routes(text)
                    wait_until(lambda tried=tried: admin_get(gw, "/readyz")["config"]["last_reload_at"] != tried,
                               what=f"a reload attempt of {text[:30]!r}")
                ready = admin_get(gw, "/readyz")["config"]
                assert ready["version"] == version, "no broken file was applied"
                assert ready["last_reload_error"]
                gw.write_routes({**cfg, "models": {"m": "l", "m2": "l"}})
                wait_until(lambda: admin_get(gw, "/readyz")["config"]["version"] > version,
                           what="the good file that followed applied")
                time.sleep(0.5)  # the scenario: traffic on the new config
            assert load.failures == [], load.failures[:5]
            assert load.total > 50
            r = httpx.post(gw.url + "/v1/chat/completions", json=body("m2", False))
            assert r.status_code == 200, "the good file that followed was applied"


def _disconnect_mid_stream(gw_url: str, payload: dict) -> float:
    """Open a stream on a raw socket, read its first bytes, hang up; the wall time of the hang-up."""
    port = int(gw_url.rsplit(":", 1)[1])
    data = json.dumps(payload).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        got = s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        time.sleep(0.15)  # the scenario: the client reads a moment longer, then hangs up mid-stream
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x00" * 8)  # plain close, no lingering
        closed_at = time.time()
    return closed_at


def test_client_disconnect_reaches_the_engine_within_100ms() -> None:
    with run_emulator(flavour="vllm", decode_tps=100) as emu:
        cfg = routes({"l": lane(emu.url)}, {"m": "l"})
        with run_gateway(cfg, env=ENV) as gw:
            delays = []
            for i in range(5):
                before = emu.stats()["cancelled_count"]
                closed_at = _disconnect_mid_stream(gw.url, body("m", True, 2000, f"cancel me {i}"))
                wait_until(lambda before=before: emu.stats()["cancelled_count"] > before,
                           what="the engine to see the cancellation",
                           interval=0.01)
                stats = emu.stats()
                assert stats["cancelled_count"] == before + 1
                delays.append(stats["cancelled"][-1]["at"] - closed_at)
            assert max(delays) < 0.1, delays
            # The gateway's records say the client left (records are written just after the end).
            wait_until(lambda: sum(1 for r in admin_get(gw, "/admin/api/records?limit=20")["records"]
                                   if r["cancelled"]) >= 5, what="the 5 cancelled requests' records")
            print("cancel delays (s):", [round(d, 4) for d in delays])


def test_client_disconnect_while_waiting_for_first_byte() -> None:
    """Hanging up before the engine's first byte cancels the upstream request too."""
    with run_emulator(flavour="vllm", ttft_ms=3000) as emu:
        cfg = routes({"l": lane(emu.url)}, {"m": "l"})
        with run_gateway(cfg, env=ENV) as gw:
            port = int(gw.url.rsplit(":", 1)[1])
            data = json.dumps(body("m", True, 10)).encode()
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
                wait_until(lambda: emu.stats()["active"], what="the request at the engine", interval=0.01)
                closed_at = time.time()
            wait_until(lambda: emu.stats()["active"] == 0, what="the engine to stop working on it", interval=0.01)
            stats = emu.stats()
            assert stats["cancelled_count"] == 1 and stats["cancelled"][-1]["stage"] == "prefill"
            assert stats["cancelled"][-1]["at"] - closed_at < 0.1


# -- hand-over and overload, in-process --------------------------------------------------------------


async def test_503_from_a_replica_hands_over_to_the_next() -> None:
    from aiohttp import web

    async def busy(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "loading"}}, status=503)

    async def fine(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    runners = []
    urls = []
    for handler in (busy, fine):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    up = Upstream.for_lane(lane_config(replicas=urls, breaker={"failures": 2, "cool_down_s": 60}))
    retried = []
    try:
        rep, resp = await up.send(up.replicas, "/v1/chat/completions", b"{}", "rid", on_retry=retried.append)
        assert rep.url == urls[1] and resp.status == 200
        resp.release()
        assert up.replicas[0].failures == 1 and len(retried) == 1
        # The last replica's 503 is the client's answer (nothing left to hand over to).
        rep, resp = await up.send([up.replicas[0]], "/v1/chat/completions", b"{}", "rid")
        assert resp.status == 503
        resp.release()
    finally:
        await up.close()
        for r in runners:
            await r.cleanup()


async def test_aftermath_queue_is_bounded_in_bytes() -> None:
    import asyncio

    from gateway.observe.aftermath import EXCHANGE_OVERHEAD_BYTES, Aftermath
    from gateway.core.exchange import Exchange

    gate = asyncio.Event()
    analysed, sunk = [], []

    async def slow_analysis(ex, lane) -> None:
        await gate.wait()
        analysed.append(ex.request_id)

    am = Aftermath(analyzers=[slow_analysis], sinks=[lambda ex, lane: sunk.append(ex.request_id)], workers=1,
                   max_queue=1000, max_queue_bytes=10 * (1_000_000 + EXCHANGE_OVERHEAD_BYTES))
    am.start()
    try:
        for i in range(30):
            ex = Exchange(request_id=f"r{i}", path="/v1/chat/completions")
            ex.body_bytes = 1_000_000  # agent turns of a megabyte each
            am.exchange_ended(ex, None)
        await until(lambda: len(sunk) == am.skipped_analysis, what="the skipped exchanges at the sinks")
        assert am.skipped_analysis >= 19, "beyond the byte budget, analysis is skipped"
        assert am.queued_bytes <= 10 * (1_000_000 + EXCHANGE_OVERHEAD_BYTES)
        assert len(sunk) == am.skipped_analysis, "skipped exchanges still reach the sinks (records)"
        gate.set()
        assert await am.drain(5)
        assert len(sunk) == 30 and am.queued_bytes == 0
    finally:
        await am.stop()
