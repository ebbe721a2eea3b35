"""The gateway's model of one replica's prefix cache: held prefixes and least-recently-used eviction."""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from array import array
from collections.abc import Awaitable

from gateway.conversations.job import Outcome
from gateway.core.exchange import Exchange
from gateway.core.runtime import LaneRuntime
from gateway.core.verdict import CacheVerdict
from gateway.prefixcache import ReplicaBlocks, SharedPrefixes
from tests.support.routes import lane_config


def test_the_longest_held_prefix_whoever_stored_it() -> None:
    blocks = ReplicaBlocks(None)
    blocks.store([1, 2, 3, 4])  # one conversation's prompt
    assert blocks.held([1, 2, 3, 9, 4]) == 3  # another's, sharing the first three blocks
    assert blocks.held([9, 1]) == 0


def test_the_least_recently_used_blocks_leave_first() -> None:
    blocks = ReplicaBlocks(10)
    blocks.store(list(range(100, 106)))  # an older session
    blocks.store(list(range(200, 205)))  # a newer one: 11 blocks, within the batch margin
    blocks.store(list(range(100, 106)))  # the older session's next turn touches its blocks again
    blocks.store([300])  # past the margin: the least recently used blocks go until the pool fits
    assert len(blocks) == 10 and blocks.evicted == 2
    assert blocks.held(list(range(100, 106))) == 6  # recently used: kept
    assert blocks.held(list(range(200, 205))) == 0  # its first blocks were the least recent


def test_a_request_finds_only_the_blocks_there_when_it_was_sent() -> None:
    blocks = ReplicaBlocks(None)
    blocks.store([1, 2, 3, 4], prompt_blocks=3, ready=10.0, done=12.0)  # prompt prefilled at 10, output by 12
    assert blocks.held([1, 2, 3, 4], at=9.0) == 0  # sent while it was still prefilling
    assert blocks.held([1, 2, 3, 4], at=11.0) == 3  # the prompt's blocks, not yet the output's
    assert blocks.held([1, 2, 3, 4], at=12.0) == 4
    blocks.store([1, 2, 5], prompt_blocks=3, ready=20.0, done=21.0)  # a later use keeps when they were first there
    assert blocks.held([1, 2, 5], at=11.0) == 2 and blocks.held([1, 2, 5], at=20.0) == 3


class _Reference:
    """The model's rules written the plain way: every block's recency and first time set by a scan of
    the whole prompt, each turn (what `ReplicaBlocks.store` does in O(the turn's new blocks))."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used, self.since, self.clock = capacity, {}, {}, 0

    def store(self, keys: list[int], prompt_blocks: int, ready: float, done: float) -> None:
        self.clock += 1
        for i, k in enumerate(keys):
            self.used[k] = self.clock
            self.since.setdefault(k, ready if i < prompt_blocks else done)


def test_a_turn_sets_the_first_time_of_its_new_blocks_only_as_a_full_scan_would() -> None:
    """Chains that share heads, grow turn by turn and are evicted: the same held prefixes, at every time,
    as the plain rules (the reference above), eviction apart (the reference never evicts)."""
    rng = random.Random(5)
    blocks, ref = ReplicaBlocks(None), _Reference(0)
    heads = [[rng.getrandbits(63) for _ in range(rng.randint(1, 40))] for _ in range(4)]
    chains = [list(rng.choice(heads)) for _ in range(12)]
    for turn in range(300):
        chain = rng.choice(chains)
        chain += [rng.getrandbits(63) for _ in range(rng.randint(0, 6))]  # the turn's new prompt blocks
        output = [rng.getrandbits(63) for _ in range(rng.randint(0, 3))]
        keys = array("Q", chain + output) if turn % 2 else chain + output  # an array, as the analysis hands it
        blocks.store(keys, len(chain), ready=float(turn), done=turn + 0.5)
        ref.store(chain + output, len(chain), float(turn), turn + 0.5)
        chain += output[:1]  # the next turn sends part of the output back
    assert len(blocks) == len(ref.used)
    for chain in chains + heads:
        for at in (0.0, 50.0, 150.5, 299.0, math.inf):
            want = 0
            for k in chain:
                if ref.since.get(k, math.inf) > at:
                    break
                want += 1
            assert blocks.held(chain, at) == want


def _filled(lane: LaneRuntime, url: str, short: int) -> SharedPrefixes:
    """A model whose pool is `short` blocks short of starting an eviction batch."""
    shared = SharedPrefixes()
    blocks = shared.replica(lane, url)
    assert blocks.capacity is not None
    rng = random.Random(9)
    while not blocks.may_evict(short):
        n = min(4096, blocks.capacity + blocks.capacity // 10 - short + 1 - len(blocks))
        blocks.store(array("Q", [rng.getrandbits(63) for _ in range(n)]), n, 1.0, 2.0)
    assert not blocks.evicted and not blocks.may_evict(short - 1)
    return shared


async def _longest_stall(work: Awaitable[object]) -> float:
    """The longest the event loop went without running a 1 ms ticker while `work` ran."""
    longest, last, done = 0.0, time.perf_counter(), False

    async def tick() -> None:
        nonlocal longest, last
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    await work
    done = True
    await ticker
    return longest


def test_an_eviction_batch_runs_off_the_event_loop() -> None:
    """A turn small enough for the event loop whose blocks start an eviction batch (in proportion to
    the pool: tens of ms for a large one) is modelled on the model's own thread, which lets the loop in
    between its chunks; the same turn applied on the loop (the control) holds it for the whole batch."""
    lane = LaneRuntime("l", lane_config(cache={"pool_tokens": 16 * (1 << 18)}), None, None)  # type: ignore[arg-type]
    url = "http://127.0.0.1:1"
    rng = random.Random(3)
    turn = array("Q", [rng.getrandbits(63) for _ in range(1000)])
    control, shared = _filled(lane, url, 500), _filled(lane, url, 500)

    def outcome() -> Outcome:
        verdict = CacheVerdict("hit", 16_000, 16_000, rendered_prompt_tokens=16_000)
        return Outcome(verdict, 2, b"{}", None, None, kv_keys=turn.tobytes())

    async def on_loop() -> None:
        control.apply(Exchange(request_id="c", replica=url), lane, outcome())

    async def measured() -> tuple[float, float]:
        return (await _longest_stall(on_loop()),
                await _longest_stall(shared.judge(Exchange(request_id="t", replica=url), lane, outcome())))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # as the gateway runs (app.py)
    try:
        held, judged = asyncio.run(measured())
    finally:
        sys.setswitchinterval(switch)
    assert control.replica(lane, url).evicted and shared.replica(lane, url).evicted  # both batches ran
    assert judged < held / 2, (judged, held)
