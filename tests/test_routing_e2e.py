"""Conversation-affine routing end to end: real gateway processes, real emulator replicas, one Redis.

Each emulator replica has its own prefix cache, so a turn that lands away from its conversation's
home shows up in the usage the engine reports, not only in the gateway's headers.
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest

from tests.support.conversations import wait_analysed
from tests.support.emulator_proc import run_emulator
from tests.support.redis_proc import run_redis
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until
from tests.support.routes import agent_routes

# This file's own Redis (started once for the module, never the machine's), a database flushed per test.
REDIS_PORT = 0
REDIS_URL = ""


@pytest.fixture(scope="module", autouse=True)
def _own_redis():
    global REDIS_PORT, REDIS_URL
    with run_redis() as port:
        REDIS_PORT, REDIS_URL = port, f"redis://127.0.0.1:{port}/13"
        yield
SYSTEM = "You are a coding agent. Read files before you change them."
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file from the workspace.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def _redis():
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    try:
        r.ping()
    except redis.RedisError:
        pytest.skip(f"the test's Redis on {REDIS_URL} does not answer")
    return r


@pytest.fixture()
def redis_db():
    r = _redis()
    r.flushdb()
    yield r
    r.flushdb()


@pytest.fixture(scope="module")
def emus():
    knobs = dict(flavour="vllm", tokenizer="dsv41", default_thinking=True, block_size=16, decode_tps=200)
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run_emulator(**knobs)) for _ in range(3)]


@pytest.fixture()
def replicas(emus):
    for e in emus:
        e.reset()
    return emus


def routes(urls: list[str], policy: str = "conversation_affinity", **affinity) -> dict:
    """One agent lane over `urls`: a replica that fails once is out for the rest of the test."""
    return agent_routes(urls, routing=policy, breaker={"failures": 1, "cool_down_s": 30},
                        **({"affinity": affinity} if affinity else {}))


class Route:
    def __init__(self, header: str) -> None:
        parts = [p.strip() for p in header.split(";")]
        self.reason = parts[0]
        self.replica = int(next(p for p in parts if p.startswith("replica="))[8:])
        self.cold = "cold" in parts[1:]

    def __repr__(self) -> str:
        return f"Route({self.reason}, {self.replica}, cold={self.cold})"


class Conversation:
    """An append-only agent: keeps what the model said (reasoning and tool calls) and answers its tools."""

    def __init__(self, name: str, *, key: bool = True) -> None:
        self.name = name
        self.key = key
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM},
                                     {"role": "user", "content": f"Task {name}: " + "find the failing test. " * 40}]
        self.cid: str | None = None
        self.turns = 0
        self.last_prompt = 0  # prompt tokens of the previous turn

    def warm(self, usage: dict) -> bool:
        """Did this turn hit the whole previous turn's prompt (to the engine's 16-token block)?"""
        return cached(usage) >= self.previous_prompt - 16 > 0

    def turn(self, gw, max_tokens: int = 20) -> tuple[Route, dict, dict]:
        headers = {"X-Conversation-Id": self.name} if self.key else {}
        body = {"model": "ds", "messages": self.messages, "tools": TOOLS, "max_tokens": max_tokens}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()
        msg = data["choices"][0]["message"]
        out = {"role": "assistant", "content": msg.get("content") or ""}
        reasoning = msg.get("reasoning") or msg.get("reasoning_content")
        if reasoning:
            out["reasoning_content"] = reasoning
        if msg.get("tool_calls"):
            out["tool_calls"] = msg["tool_calls"]
        self.messages.append(out)
        for call in msg.get("tool_calls") or []:
            self.messages.append({"role": "tool", "tool_call_id": call["id"],
                                  "content": f"contents of {self.name}_{self.turns}.py\n" + "x = 1\n" * 30})
        if not msg.get("tool_calls"):
            self.messages.append({"role": "user", "content": f"Continue with step {self.turns}."})
        self.cid = r.headers["x-gateway-conversation"].split(";")[0]
        self.turns += 1
        self.previous_prompt, self.last_prompt = self.last_prompt, data["usage"]["prompt_tokens"]
        return Route(r.headers["x-gateway-route"]), data["usage"], dict(r.headers)


def cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_affinity_keeps_each_conversation_on_one_replica(replicas, redis_db):
    with run_gateway(routes([e.url for e in replicas]), env={"GATEWAY_REDIS_URL": REDIS_URL}) as gw:
        convs = [Conversation(f"keep-{i}") for i in range(3)]
        homes: dict[str, set[int]] = {c.name: set() for c in convs}
        for t in range(5):
            for c in convs:
                route, usage, _ = c.turn(gw)
                homes[c.name].add(route.replica)
                assert not route.cold
                assert route.reason == ("least_loaded" if t == 0 else "home"), (t, route)
                if t:
                    assert c.warm(usage), usage
        assert all(len(h) == 1 for h in homes.values()), homes
        assert len(set().union(*homes.values())) == 3  # three conversations, three homes
        per_replica = [e.stats()["requests"] for e in replicas]
        assert per_replica == [5, 5, 5]
        state = wait_analysed(gw, convs[0].cid, 5)
        assert state["replica"] == replicas[next(iter(homes[convs[0].name]))].url
        assert state["last_cache"]["verdict"] == "hit"
        routing = httpx.get(gw.url + "/admin/routing").json()["lanes"]["ds"]
        assert routing["decisions"] == {"least_loaded": 3, "home": 12}


def test_round_robin_moves_turns_and_says_so(replicas, redis_db):
    with run_gateway(routes([e.url for e in replicas], "round_robin"), env={"GATEWAY_REDIS_URL": REDIS_URL}) as gw:
        conv = Conversation("rr")
        seen = []
        for _ in range(3):
            route, usage, _ = conv.turn(gw)
            wait_analysed(gw, conv.cid, conv.turns)
            seen.append(route)
        assert len({r.replica for r in seen}) == 3
        assert [r.cold for r in seen] == [False, True, True]
        state = wait_analysed(gw, conv.cid, 3)
        # A miss because the turn moved is not an eviction.
        assert state["last_cache"]["verdict"] == "cold" and state["last_cache"]["cause"] == "rehomed"


def test_overloaded_home_rehomes_and_the_next_turn_stays_there(replicas, redis_db):
    cfg = routes([e.url for e in replicas], load_window_s=0.5)
    with run_gateway(cfg, env={"GATEWAY_REDIS_URL": REDIS_URL}) as gw:
        target = Conversation("target")
        home = target.turn(gw)[0].replica
        wait_analysed(gw, target.cid, 1)
        target.turn(gw)
        # Other conversations, placed by homes: keep the ones that live where the target does.
        crowd = []
        i = 0
        while len(crowd) < 4:
            c = Conversation(f"crowd-{i}")
            i += 1
            if c.turn(gw)[0].replica == home:
                crowd.append(c)
            assert i < 20
        # Their next turns go home and stay in flight (slow decode): the home is overloaded.
        threads = [threading.Thread(target=c.turn, args=(gw,), kwargs={"max_tokens": 600}) for c in crowd]
        for th in threads:
            th.start()
        time.sleep(1.5)  # the scenario: past the load window, overloaded now and on average
        route, usage, _ = target.turn(gw)
        assert route.reason == "rehomed_overload" and route.cold and route.replica != home, route
        assert not target.warm(usage)  # cold on its new home
        new_home = route.replica
        state = wait_analysed(gw, target.cid, 3)
        assert state["replica"] == replicas[new_home].url
        assert state["last_cache"]["verdict"] == "cold" and state["last_cache"]["cause"] == "rehomed"
        for th in threads:
            th.join()
        route, usage, _ = target.turn(gw)
        assert route.reason == "home" and route.replica == new_home and not route.cold
        assert target.warm(usage)


def test_unhealthy_home_rehomes(redis_db):
    knobs = dict(flavour="vllm", tokenizer="dsv41", default_thinking=True, block_size=16)
    with contextlib.ExitStack() as stack:
        emus = [stack.enter_context(run_emulator(**knobs)) for _ in range(3)]
        with run_gateway(routes([e.url for e in emus]), env={"GATEWAY_REDIS_URL": REDIS_URL}) as gw:
            conv = Conversation("sick")
            home = conv.turn(gw)[0].replica
            conv.turn(gw)
            wait_analysed(gw, conv.cid, 2)
            emus[home].proc.terminate()
            emus[home].proc.wait(10)
            # The home refuses connections: failover walks on, and the conversation has a new home.
            route, usage, headers = conv.turn(gw)
            assert route.reason == "rehomed_unhealthy" and route.cold and route.replica != home, route
            new_home = route.replica
            state = wait_analysed(gw, conv.cid, 3)
            assert state["replica"] == emus[new_home].url
            assert state["last_cache"]["verdict"] == "cold" and state["last_cache"]["cause"] == "rehomed"
            # The breaker is open now: the next turns go to the new home directly, warm.
            for _ in range(2):
                route, usage, _ = conv.turn(gw)
                assert route.reason == "home" and route.replica == new_home, route
                assert conv.warm(usage)


def test_two_gateways_on_one_redis_alternate_turns_and_keep_affinity(replicas, redis_db):
    env = {"GATEWAY_REDIS_URL": REDIS_URL}
    cfg = routes([e.url for e in replicas])
    with run_gateway(cfg, env=env) as g1, run_gateway(cfg, env=env) as g2:
        gws = [g1, g2]
        # One conversation named by a header, two found by lineage only (what the model said).
        convs = [Conversation("two-0"), Conversation("two-1", key=False), Conversation("two-2", key=False)]
        homes: dict[str, set[int]] = {c.name: set() for c in convs}
        for t in range(6):
            for c in convs:
                route, usage, headers = c.turn(gws[t % 2])
                homes[c.name].add(route.replica)
                assert not route.cold, (c.name, t, route)
                if t:
                    assert route.reason in ("home", "prefix"), route
                    assert c.warm(usage), (c.name, t, usage)
            for c in convs:  # both processes see the same conversations
                wait_analysed(gws[t % 2], c.cid, c.turns)
        assert all(len(h) == 1 for h in homes.values()), homes
        for c in convs:
            a = httpx.get(f"{g1.url}/admin/conversations/{c.cid}").json()
            b = httpx.get(f"{g2.url}/admin/conversations/{c.cid}").json()
            assert a["replica"] == b["replica"] == replicas[homes[c.name].pop()].url
            assert a["turn"] == b["turn"] == 6
        # A drift seen by one process is an alert for both; the drifted turn still goes home.
        c = convs[0]
        for m in c.messages:
            m.pop("reasoning_content", None)
        route, _, _ = c.turn(g1)
        assert route.reason == "home" and not route.cold
        wait_analysed(g1, c.cid, 7)
        alerts = httpx.get(g2.url + "/admin/drift").json()["alerts"]
        assert any(a["conversation"] == c.cid and a["cause"] == "client_stripped_reasoning" for a in alerts), alerts
        # Each process sees the other on the load board.
        wait_until(lambda: httpx.get(g2.url + "/admin/routing").json()["process"]["board"]["peers"] >= 1,
                   what="the other process on the load board")
        assert httpx.get(g2.url + "/admin/routing").json()["process"]["store"] == "redis"


class TcpProxy:
    """A loopback TCP proxy to Redis that can be cut (stop) and restored (start): Redis briefly away."""

    def __init__(self, target_port: int) -> None:
        import asyncio

        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = None
        self.writers: set = set()
        from tests.support.gateway_proc import free_port

        self.port = free_port()

    def _call(self, coro):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(5)

    async def _pipe(self, reader, writer) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _client(self, reader, writer) -> None:
        import asyncio

        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _start(self) -> None:
        import asyncio

        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        self.server.close()
        for w in list(self.writers):
            w.close()
        self.writers.clear()
        await self.server.wait_closed()

    def start(self) -> None:
        self._call(self._start())

    def stop(self) -> None:
        self._call(self._stop())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_redis_briefly_away_local_decisions_then_convergence(redis_db):
    import orjson

    proxy = TcpProxy(REDIS_PORT)
    proxy.start()
    knobs = dict(flavour="vllm", block_size=16)
    try:
        with contextlib.ExitStack() as stack:
            emus = [stack.enter_context(run_emulator(**knobs)) for _ in range(3)]
            cfg = routes([e.url for e in emus])
            gw = stack.enter_context(run_gateway(cfg, env={"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{proxy.port}/13"}))
            other = stack.enter_context(run_gateway(cfg, env={"GATEWAY_REDIS_URL": REDIS_URL}))
            conv = Conversation("outage")
            home = conv.turn(gw)[0].replica
            conv.turn(gw)
            wait_analysed(gw, conv.cid, 2)
            proxy.stop()  # Redis unreachable from `gw`: its store falls back to the process's local copy
            route, usage, _ = conv.turn(gw)
            assert route.reason == "home" and route.replica == home and conv.warm(usage), route
            emus[home].proc.terminate()  # ... and the home dies meanwhile: a move only `gw` knows of
            emus[home].proc.wait(10)
            route, _, _ = conv.turn(gw)
            assert route.reason == "rehomed_unhealthy" and route.replica != home, route
            moved = route.replica
            route, usage, _ = conv.turn(gw)
            assert route.reason == "home" and route.replica == moved and conv.warm(usage), route
            assert Conversation("during-outage").turn(gw)[0].reason == "least_loaded"
            stale = orjson.loads(redis_db.get(f"gw:route:home:{conv.cid}"))
            assert stale["r"] == emus[home].url  # Redis still has the pre-outage home
            proxy.start()
            time.sleep(1.5)  # the scenario: past the store's back-off (it retries Redis a second after a failure)
            # The later decision (the move, in gw's local copy) wins over Redis's older record ...
            route, usage, _ = conv.turn(gw)
            assert route.reason == "home" and route.replica == moved and conv.warm(usage), route
            # ... and is written back: Redis converges, and another process follows it.
            wait_until(lambda: orjson.loads(redis_db.get(f"gw:route:home:{conv.cid}"))["r"] == emus[moved].url,
                       what="Redis to converge on the move", detail=lambda: gw.log()[-3000:])
            wait_analysed(other, conv.cid, 1)
            route, usage, _ = conv.turn(other)
            assert route.replica == moved and conv.warm(usage), route
    finally:
        proxy.close()


def test_uvicorn_workers_share_homes_through_redis(replicas, redis_db):
    """`gateway serve --workers 2 --redis ...`: the kernel spreads connections over two processes."""
    with run_gateway(routes([e.url for e in replicas]), env={"GATEWAY_REDIS_URL": REDIS_URL}, workers=2) as gw:
        convs = [Conversation(f"workers-{i}") for i in range(2)]
        homes: dict[str, set[int]] = {c.name: set() for c in convs}
        for t in range(6):
            for c in convs:
                route, usage, _ = c.turn(gw)  # a new connection each turn: either worker may answer
                homes[c.name].add(route.replica)
                if t:
                    assert route.reason == "home" and c.warm(usage), (t, route, usage)
        assert all(len(h) == 1 for h in homes.values()), homes
