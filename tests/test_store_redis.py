"""RedisStore across a Redis restart: the shared copy is known to be missing, not taken for empty, and
a restart costs no failed command (the pooled connections it broke are re-opened once)."""

from __future__ import annotations

import asyncio

from gateway.store.redis_store import RedisStore
from tests.support.emulator_proc import free_port
from tests.support.redis_proc import run_redis


def test_restart_costs_no_failed_command_and_outage_is_told_apart_from_empty() -> None:
    port = free_port()

    async def scenario() -> None:
        store = RedisStore(f"redis://127.0.0.1:{port}/0", retry_after_s=0.2)
        with run_redis(port):
            await store.set("k", b"v1", 60)
            assert await store.mget_shared(["k", "absent"]) == [b"v1", None]
        # Redis away: the shared copy is unknown (None), the local copy still answers reads.
        assert await store.mget_shared(["k"]) is None
        assert await store.mget(["k"]) == [b"v1"]
        await store.set("k", b"v2", 60)  # written locally only
        failures = store.failures
        assert failures >= 1
        await asyncio.sleep(0.25)  # the scenario: past the store's retry window (0.2 s)
        with run_redis(port):  # a fresh, empty Redis on the same port
            assert await store.mget_shared(["k"]) == [None]  # the broken pooled connection was re-opened
            await store.set("k", b"v3", 60)
            assert await store.mget_shared(["k"]) == [b"v3"]
            assert store.failures == failures
        await store.close()

    asyncio.run(scenario())


def test_set_many_writes_both_copies_with_the_ttl_and_keeps_the_local_one_in_an_outage() -> None:
    port = free_port()

    async def scenario() -> None:
        store = RedisStore(f"redis://127.0.0.1:{port}/0", retry_after_s=60)
        items = [("head:c1", b"h"), ("anchor:a", b"c1|1"), ("anchor:b", b"c1|1")]
        with run_redis(port):
            await store.set_many(items, 30)
            assert await store.mget_shared([k for k, _ in items]) == [v for _, v in items]
            ttls = [await store.client.pttl("gw:" + k) for k, _ in items]
            assert all(25_000 < t <= 30_000 for t in ttls), ttls
        # Redis away: the batch is written to this process's copy, and the failure counted once.
        failures = store.failures
        await store.set_many([("head:c2", b"h2")], 30)
        assert store.failures == failures + 1
        assert await store.mget(["head:c2", "head:c1"]) == [b"h2", b"h"]
        await store.close()

    asyncio.run(scenario())
