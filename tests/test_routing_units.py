"""Routing policies in process: the affinity decision table, bounded load, prefix index, load board."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from gateway.core.config import Affinity, ConfigError, parse_routes
from gateway.core.exchange import Exchange
from gateway.routing import POLICIES, make_policy, prefix_index
from gateway.core.exchange import LoadAtMove, RouteDecision
from gateway.routing.conversation_affinity import LONG_PREFIX_CHARS, ConversationAffinity, Hint
from gateway.routing.load import LoadBoard
from gateway.routing.round_robin import RoundRobin
from gateway.routing.shared import RoutingShared
from gateway.store import MemoryStore
from gateway.upstream.replicas import Replica

URLS = ["http://r0", "http://r1", "http://r2"]


def replicas(*inflight: int) -> list[Replica]:
    return [Replica(u, inflight=n) for u, n in zip(URLS, inflight)]


def exchange(home: str | None = None, turn: int = 3, hint: Hint | None = None, is_new: bool = False) -> Exchange:
    ex = Exchange("req")
    state = SimpleNamespace(id="c1", turn=turn if home else 0, replica=home, last=None)
    ex.conversation = SimpleNamespace(state=state, is_new=is_new)
    if hint is not None:
        ex.routing_hint = hint
    return ex


def affinity(**settings) -> ConversationAffinity:
    settings.setdefault("load_window_s", 0.0)  # the instant count alone, unless a test says otherwise
    router = ConversationAffinity()
    router.bind(RoutingShared(None, LoadBoard(None)), "lane", Affinity(**settings))
    return router


def test_policies_are_registered():
    assert set(POLICIES) == {"round_robin", "least_inflight", "conversation_affinity"}
    assert isinstance(make_policy("conversation_affinity"), ConversationAffinity)


def test_home_is_kept_while_healthy_and_not_overloaded():
    router = affinity()
    reps = replicas(2, 0, 0)  # mean 0.67, bound 1.83: 2 is over ...
    ex = exchange(home="http://r1")
    order = router.order(reps, ex)
    assert order[0].url == "http://r1"
    assert ex.routing == RouteDecision("conversation_affinity", "http://r1", "home", False, previous="http://r1")
    assert ex.response_headers["X-Gateway-Route"] == "home; replica=1"
    assert {r.url for r in order} == set(URLS)  # the rest follow, for failover


def test_idle_lane_does_not_bounce():
    router = affinity()
    ex = exchange(home="http://r0")
    assert router.order(replicas(1, 0, 0), ex)[0].url == "http://r0"  # 1 <= 1.25 x 0.33 + 1
    assert ex.routing.reason == "home"


def test_overloaded_home_rehomes_to_the_least_loaded_and_says_cold():
    router = affinity()
    ex = exchange(home="http://r0")
    order = router.order(replicas(5, 2, 1), ex)  # mean 2.67, bound 4.33
    assert order[0].url == "http://r2"
    rec = ex.routing
    assert rec.reason == "rehomed_overload" and rec.expected_cold is True and rec.previous == "http://r0"
    assert rec.load == LoadAtMove(home=5, mean=2.67, bound=4.33)
    assert ex.response_headers["X-Gateway-Route"] == "rehomed_overload; replica=2; cold"


def test_load_factor_and_slack_are_settings():
    ex = exchange(home="http://r0")
    affinity(max_load_factor=2.0, load_slack=0).order(replicas(4, 1, 1), ex)  # bound 4
    assert ex.routing.reason == "home"
    ex = exchange(home="http://r0")
    affinity(max_load_factor=1.0, load_slack=0).order(replicas(4, 1, 1), ex)  # bound 2
    assert ex.routing.reason == "rehomed_overload"


def test_a_momentary_spike_does_not_rehome_with_a_load_window():
    router = affinity(load_window_s=2.0)
    board = router.shared.board
    reps = replicas(0, 0, 0)
    board._lanes = lambda: {"lane": reps}
    t = time.monotonic()
    for i in range(30):  # three seconds of an idle lane
        board.sample(t + 0.1 * i)
    reps[0].inflight = 5
    board.sample(t + 3.1)
    ex = exchange(home="http://r0")
    router.order(reps, ex)
    assert ex.routing.reason == "home"  # over now, not on average
    for i in range(40):  # it stays overloaded
        board.sample(t + 3.2 + 0.1 * i)
    ex = exchange(home="http://r0")
    router.order(reps, ex)
    assert ex.routing.reason == "rehomed_overload"


def test_unhealthy_home_rehomes():
    router = affinity()
    reps = replicas(0, 0, 0)
    reps[1].open_until = time.monotonic() + 60  # breaker open
    ex = exchange(home="http://r1")
    order = router.order(reps, ex)
    assert "http://r1" not in [r.url for r in order]
    rec = ex.routing
    assert rec.reason == "rehomed_unhealthy" and rec.expected_cold is True


def test_home_that_left_the_lane_rehomes():
    ex = exchange(home="http://gone")
    affinity().order(replicas(0, 0, 0), ex)
    assert ex.routing.reason == "rehomed_unhealthy"


def test_no_live_replica_gives_an_empty_order():
    reps = replicas(0, 0, 0)
    for r in reps:
        r.open_until = time.monotonic() + 60
    assert affinity().order(reps, exchange(home="http://r0")) == []


def test_new_conversations_spread_by_homes_then_load():
    router = affinity()
    chosen = []
    for _ in range(6):
        ex = exchange(is_new=True)
        chosen.append(router.order(replicas(0, 0, 0), ex)[0].url)
        assert ex.routing.reason == "least_loaded"
        assert ex.routing.expected_cold is False
    assert sorted(chosen) == sorted(URLS * 2)


def test_new_conversation_follows_the_longest_known_prefix():
    router = affinity()
    for url in URLS:  # one home each: every replica at its fair share
        router.shared.board.homes.add("lane", url, 1)
    hint = Hint(prefix={"http://r0": (0.2, 100), "http://r2": (0.9, 5000)})
    ex = exchange(hint=hint, is_new=True)
    assert router.order(replicas(0, 0, 0), ex)[0].url == "http://r2"
    assert ex.routing.reason == "prefix" and ex.routing.share == 0.9


def test_short_prefix_share_is_ignored():
    router = affinity(prefix_min_share=0.5)
    ex = exchange(hint=Hint(prefix={"http://r2": (0.3, 500)}), is_new=True)
    router.order(replicas(0, 0, 0), ex)
    assert ex.routing.reason == "least_loaded"


def test_prefix_on_a_crowded_replica_only_when_long():
    router = affinity()
    router.shared.board.homes.add("lane", "http://r2", 1.5)  # r2 is home to more than its share
    ex = exchange(hint=Hint(prefix={"http://r2": (1.0, 400)}), is_new=True)
    assert router.order(replicas(0, 0, 0), ex)[0].url != "http://r2"
    router = affinity()
    router.shared.board.homes.add("lane", "http://r2", 1.5)
    ex = exchange(hint=Hint(prefix={"http://r2": (1.0, LONG_PREFIX_CHARS)}), is_new=True)
    assert router.order(replicas(0, 0, 0), ex)[0].url == "http://r2"


def test_head_drift_places_anew_and_says_cold():
    router = affinity()
    router.shared.board.homes.add("lane", "http://r0", 3)
    ex = exchange(home="http://r0", hint=Hint(home="http://r0", drift="effort"))
    order = router.order(replicas(0, 0, 0), ex)
    rec = ex.routing
    assert order[0].url != "http://r0"
    assert rec.reason == "least_loaded" and rec.expected_cold is True and rec.drift == "effort"


def test_shared_home_record_wins_when_fresher_than_the_state():
    router = affinity()
    # The state (analysed turn 3) says r0; the home record of turn 4 (not analysed yet) says r2.
    ex = exchange(home="http://r0", turn=3, hint=Hint(home="http://r2", home_turn=4))
    assert router.order(replicas(0, 0, 0), ex)[0].url == "http://r2"
    ex = exchange(home="http://r0", turn=5, hint=Hint(home="http://r2", home_turn=4))
    assert router.order(replicas(0, 0, 0), ex)[0].url == "http://r0"


def test_failover_updates_the_record():
    router = affinity()
    reps = replicas(0, 0, 0)
    ex = exchange(home="http://r0")
    router.order(reps, ex)
    router.served(reps[2], ex)  # r0 refused the connection; the failover walk reached r2
    rec = ex.routing
    assert rec.replica == "http://r2" and rec.planned == "http://r0" and rec.failover
    assert rec.reason == "rehomed_unhealthy" and rec.expected_cold is True
    assert ex.response_headers["X-Gateway-Route"] == "rehomed_unhealthy; replica=2; cold"


def test_round_robin_says_when_a_turn_moved():
    rr = RoundRobin()
    reps = replicas(0, 0, 0)
    seen = []
    for _ in range(3):
        ex = exchange(home="http://r0")
        rr.order(reps, ex)
        seen.append((ex.routing.replica, ex.routing.expected_cold))
    assert seen == [("http://r0", False), ("http://r1", True), ("http://r2", True)]


def test_prefix_positions_are_sampled():
    assert prefix_index.positions(1) == [0]
    assert prefix_index.positions(10) == [0, 1, 2, 3, 4, 6, 8, 9]
    assert len(prefix_index.positions(1600)) < 25


def _messages(n: int, tag: str = "") -> list[dict]:
    return [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 else "assistant", "content": f"message {i}{tag}"} for i in range(1, n)]


def test_prefix_chain_agrees_on_a_common_prefix_only():
    head = prefix_index.seed("lane", "t", True, 50, None)
    a = dict(prefix_index.sampled_chain(_messages(20), head))
    b = dict(prefix_index.sampled_chain(_messages(40), head))
    assert all(a[p] == b[p] for p in a if p < 19)
    assert a[19] != b.get(19)
    other = prefix_index.seed("lane", "t", True, 75, None)  # another effort renders another head
    assert dict(prefix_index.sampled_chain(_messages(20), other))[0] != a[0]


def test_lookup_finds_the_longest_prefix_per_replica():
    head = prefix_index.seed("lane", "t", None, None, None)
    store: dict[str, bytes] = {}
    for k in prefix_index.entries(_messages(12), head, "http://r1"):
        store[k] = b"1"
    for k in prefix_index.entries(_messages(3), head, "http://r2"):
        store[k] = b"1"
    lookup = prefix_index.Lookup(_messages(16), head, URLS)
    best = lookup.best([store.get(k) for k in lookup.keys])
    assert set(best) == {"http://r1", "http://r2"}
    assert best["http://r1"][0] > best["http://r2"][0] > 0


class SharedMemory(MemoryStore):
    name = "shared-memory"  # stands in for Redis: one store, several boards


def test_load_boards_see_each_other():
    async def main():
        store = SharedMemory()
        a, b = LoadBoard(store), LoadBoard(store)
        ra, rb = replicas(3, 0, 0), replicas(0, 1, 0)
        a._lanes = lambda: {"lane": ra}
        b._lanes = lambda: {"lane": rb}
        a.homes.add("lane", "http://r0", 2)
        await a.exchange()
        await b.exchange()
        await a.exchange()
        assert b.inflight("lane", "http://r0", rb[0].inflight) == 3
        assert a.inflight("lane", "http://r1", ra[1].inflight) == 1
        assert b.home_count("lane", "http://r0") == pytest.approx(2, abs=0.01)
        assert a.peers == b.peers == 1

    asyncio.run(main())


def test_affinity_settings_are_validated():
    base = ("lanes:\n  l:\n    replicas: [http://a]\n    upstream_model: m\n    affinity: {%s}\n"
            "models:\n  m: l\n")
    assert parse_routes(base % "max_load_factor: 1.5").lanes["l"].affinity.max_load_factor == 1.5
    with pytest.raises(ConfigError, match="max_load_factor"):
        parse_routes(base % "max_load_factor: 0.5")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_routes(base % "bogus: 1")


class FallbackStore(MemoryStore):
    """Redis-like: a shared copy plus the process's local fallback (`local`)."""

    name = "redis"

    def __init__(self) -> None:
        super().__init__()
        self.local = MemoryStore()

    async def mget_fallback(self, keys: list[str]) -> list[bytes | None]:
        return await self.local.mget(keys)

    async def get_fallback(self, key: str) -> bytes | None:
        return await self.local.get(key)


def test_after_an_outage_the_later_home_decision_wins():
    import orjson

    async def main():
        store = FallbackStore()
        router = ConversationAffinity()
        router.bind(RoutingShared(store, LoadBoard(store)), "lane", Affinity(load_window_s=0))
        lane = SimpleNamespace(name="lane", config=SimpleNamespace(engine="vllm"),
                               upstream=SimpleNamespace(replicas=replicas(0, 0, 0)))
        # Redis kept the pre-outage home; during the outage this process moved the conversation to r2.
        await store.set("route:home:c1", orjson.dumps({"r": "http://r0", "t": 3, "at": 100.0}), 60)
        await store.local.set("route:home:c1", orjson.dumps({"r": "http://r2", "t": 5, "at": 200.0}), 60)
        ex = exchange(home="http://r0", turn=3)
        await router.prepare(ex, lane, {"messages": [{"role": "user", "content": "hi"}]})
        assert router.order(lane.upstream.replicas, ex)[0].url == "http://r2"
        # ... and a later decision of another process (only in the shared copy) wins over a stale local one.
        await store.set("route:home:c1", orjson.dumps({"r": "http://r1", "t": 6, "at": 300.0}), 60)
        ex = exchange(home="http://r0", turn=3)
        await router.prepare(ex, lane, {"messages": [{"role": "user", "content": "hi"}]})
        assert router.order(lane.upstream.replicas, ex)[0].url == "http://r1"

    asyncio.run(main())


def test_served_writes_the_home_and_prefix_entries():
    import orjson

    async def main():
        store = FallbackStore()
        shared = RoutingShared(store, LoadBoard(store))
        router = ConversationAffinity()
        router.bind(shared, "lane", Affinity(load_window_s=0))
        reps = replicas(0, 0, 0)
        lane = SimpleNamespace(name="lane", config=SimpleNamespace(engine="vllm"),
                               upstream=SimpleNamespace(replicas=reps))
        body = {"messages": _messages(10)}
        ex = exchange(is_new=True)
        ex.body = body
        await router.prepare(ex, lane, body)
        chosen = router.order(reps, ex)[0]
        router.served(chosen, ex)
        await shared.drain()
        home = orjson.loads(await store.get("route:home:c1"))
        assert home["r"] == chosen.url and home["t"] == 1
        # A new conversation that starts the same way finds it.
        ex2 = exchange(is_new=True)
        ex2.conversation.state.id = "c2"
        await router.prepare(ex2, lane, {"messages": _messages(12)})
        assert ex2.routing_hint.prefix[chosen.url][0] > 0.5

    asyncio.run(main())


def test_requests_without_a_conversation_are_not_homes():
    router = affinity()
    ex = Exchange("completion")  # /v1/completions: no conversation
    assert router.order(replicas(0, 0, 0), ex)
    assert ex.routing.reason == "least_loaded"
    assert all(router.shared.board.home_count("lane", u) == 0 for u in URLS)


def test_requests_without_a_conversation_take_turns_on_an_idle_lane():
    router = affinity()
    seen = set()
    for _ in range(3):
        ex = Exchange("completion")
        seen.add(router.order(replicas(0, 0, 0), ex)[0].url)
    assert seen == set(URLS)
