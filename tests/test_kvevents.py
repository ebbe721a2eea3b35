"""KV-cache events: decoding as vLLM encodes, the index, verdicts, pressure, and the stream
through a real ZMQ publisher on loopback (gaps replayed, engine restarts, the stream lost)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import tracemalloc

import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.kvevents import chain
from gateway.kvevents.events import BadPayload, Batch, Cleared, Removed, Stored, decode_batch
from gateway.kvevents.index import ReplicaIndex
from gateway.kvevents.pressure import Pressure
from gateway.kvevents.subscriber import Subscriber
from gateway.kvevents.verdict import Question, explain
from tests.support.kv_publisher import Publisher, cleared, encode, golden_payload, removed, stored
from tests.support.poll import until

BS = 4


def ehash(parent: bytes | None, tokens: list[int]) -> bytes:
    """A stand-in for the engine's block hash (opaque to the gateway: only compared for equality)."""
    return hashlib.sha256((parent or b"root") + repr(tokens).encode()).digest()


def conv_blocks(tokens: list[int], bs: int = BS) -> list[tuple[bytes, bytes | None, list[int]]]:
    out, parent = [], None
    for i in range(len(tokens) // bs):
        chunk = tokens[i * bs:(i + 1) * bs]
        h = ehash(parent, chunk)
        out.append((h, parent, chunk))
        parent = h
    return out


def stored_event(blocks, bs: int = BS) -> dict:
    return stored([b[0] for b in blocks], blocks[0][1], [t for b in blocks for t in b[2]], bs)


def apply(index: ReplicaIndex, events: list[dict], t: float) -> None:
    index.apply(decode_batch(encode(events)), t)


# -- decoding ------------------------------------------------------------------------------------------


def test_decodes_vllms_own_encoding_byte_for_byte():
    assert encode([stored([b"\x01" * 32], None, [1, 2], 2), removed([b"\x01" * 32]), cleared()], ts=1.5) \
        == golden_payload()
    batch = decode_batch(golden_payload())
    assert batch.ts == 1.5
    s, r, c = batch.events
    assert isinstance(s, Stored) and s.block_hashes == [b"\x01" * 32] and s.parent is None
    assert list(s.token_ids) == [1, 2] and s.block_size == 2
    assert isinstance(r, Removed) and r.block_hashes == [b"\x01" * 32]
    assert isinstance(c, Cleared)


def test_decodes_the_array_form_of_sglang_and_older_vllm():
    # Older vLLM (array_like events, with medium) ...
    payload = msgpack.packb([2.0, [["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None, "GPU"],
                                   ["BlockRemoved", [11], "GPU"], ["AllBlocksCleared"]]])
    s, r, c = decode_batch(payload).events
    assert s.block_hashes == [11, 12] and list(s.token_ids) == [1, 2, 3, 4] and s.block_size == 2
    assert r.block_hashes == [11] and isinstance(c, Cleared)
    # ... and SGLang (python/sglang/srt/disaggregation/kv_events.py: no medium, no dp rank, int hashes).
    payload = msgpack.packb([3.0, [["BlockStored", [21], 20, [5, 6], 2, None], ["BlockRemoved", [21]]]])
    s, r = decode_batch(payload).events
    assert s.block_hashes == [21] and s.parent == 20 and r.block_hashes == [21]


def test_other_tiers_and_bad_payloads():
    payload = encode([{**stored([1], None, [1, 2], 2), "medium": "CPU"}, {"type": "Unknown"}])
    batch = decode_batch(payload)
    assert batch.events == [] and batch.skipped == 2
    with pytest.raises(ValueError):
        decode_batch(b"\xc1not msgpack")
    with pytest.raises(ValueError):
        decode_batch(msgpack.packb({"nothing": 1}))


# -- keys, index, verdicts ------------------------------------------------------------------------------


def test_keys_from_events_equal_keys_from_the_render():
    tokens = list(range(100, 100 + 6 * BS + 2))  # six full blocks and a partial one
    index = ReplicaIndex()
    blocks = conv_blocks(tokens)
    apply(index, [stored_event(blocks[:2])], 1.0)
    apply(index, [stored_event(blocks[2:])], 2.0)  # a later event chains through the parent's hash
    keys = chain.keys(tokens, BS)
    assert len(keys) == 6 and index.held_prefix(keys) == 6
    assert index.held_prefix(chain.keys([7] + tokens[1:], BS)) == 0  # token 0 differs: nothing matches
    assert index.block_size == BS and index.held_tokens == 6 * BS


def _two_conversations():
    a = list(range(1000, 1000 + 8 * BS))
    b = list(range(5000, 5000 + 8 * BS))
    return a, b, conv_blocks(a), conv_blocks(b)


def test_eviction_names_the_displacing_conversation():
    a, b, ba, bb = _two_conversations()
    index = ReplicaIndex()
    apply(index, [stored_event(ba)], 10.0)  # A's turn 1 ends at 11
    index.attribute(chain.keys(a, BS), "conv-a")
    apply(index, [stored_event(bb[:6])], 20.0)
    apply(index, [removed([h for h, _, _ in reversed(ba[3:])]), stored_event(bb[6:])], 21.0)  # LRU: A's tail
    index.attribute(chain.keys(b, BS), "conv-b")
    v = explain(index, Question("conv-a", chain.keys(a, BS), len(a) + 10, len(a), 3 * BS, 30.0, 11.0))
    assert v.cause == "pool_pressure" and v.held_tokens == 3 * BS and v.agrees
    assert v.first_missing_block == 3 and v.missing_blocks == 5 and v.removed_at == 21.0
    assert [(d.conversation, d.tokens) for d in v.displaced_by] == [("conv-b", 8 * BS)]
    assert v.removed == ((3, 7, "evicted", 21.0, 21.0),)
    # Held when asked: the same question about a moment before the removal says so.
    assert explain(index, Question("conv-a", chain.keys(a, BS), len(a) + 10, len(a), len(a), 20.5, 11.0)).cause \
        == "held"


def test_a_turns_own_stores_arriving_after_it_was_judged_do_not_displace_it():
    # The turn is judged when its answer ends; its blocks' KV events may reach the gateway later. Those
    # stores belong to the prefix being asked about and are not what evicted it.
    a, b, ba, bb = _two_conversations()
    index = ReplicaIndex()
    index.attribute(chain.keys(a, BS), "conv-a")  # judged at 10.5, before its events arrived
    apply(index, [stored_event(ba)], 11.0)
    apply(index, [stored_event(bb[:6])], 20.0)
    apply(index, [removed([h for h, _, _ in reversed(ba[3:])]), stored_event(bb[6:])], 21.0)
    index.attribute(chain.keys(b, BS), "conv-b")
    v = explain(index, Question("conv-a", chain.keys(a, BS), len(a) + 10, len(a), 3 * BS, 30.0, 10.5))
    assert v.cause == "pool_pressure"
    assert [(d.conversation, d.tokens) for d in v.displaced_by] == [("conv-b", 8 * BS)]


def test_cleared_restarted_and_never_stored():
    a, b, ba, bb = _two_conversations()
    index = ReplicaIndex()
    apply(index, [stored_event(ba)], 10.0)
    index.attribute(chain.keys(a, BS), "conv-a")
    apply(index, [cleared()], 12.0)
    v = explain(index, Question("conv-a", chain.keys(a, BS), len(a) + 1, len(a), 0, 13.0, 11.0))
    assert v.cause == "cache_cleared" and v.held_tokens == 0 and v.removed_at == 12.0
    apply(index, [stored_event(ba)], 14.0)
    index.reset("restarted", 15.0)
    v = explain(index, Question("conv-a", chain.keys(a, BS), len(a) + 1, len(a), 0, 16.0, 14.5))
    assert v.cause == "engine_restarted"
    # B's previous turn never stored anything (it failed mid-prefill): never stored, not an eviction.
    v = explain(index, Question("conv-b", chain.keys(b, BS), len(b) + 1, len(b), 0, 16.0, 15.5))
    assert v.cause == "never_stored" and v.displaced_by == ()
    # The stream was lost in between: the gateway does not guess.
    v = explain(index, Question("conv-b", chain.keys(b, BS), len(b) + 1, len(b), 0, 16.0, 15.5, stream_ok=False))
    assert v.cause == "unknown"


def test_a_reset_published_in_the_step_that_schedules_the_turn_comes_before_it():
    # vLLM publishes AllBlocksCleared with the next step's events: when that step schedules the
    # conversation's next turn, the clear arrives after the turn was sent, in one batch ahead of the
    # turn's own stores. The engine's order decides: nothing was held, the reset is the cause.
    a, _, ba, _ = _two_conversations()
    index = ReplicaIndex()
    apply(index, [stored_event(ba[:6])], 10.0)  # turn 1
    index.attribute(chain.keys(a, BS), "conv-a")
    apply(index, [cleared(), stored_event(ba)], 13.0)  # turn 2, sent at 12.5, re-stores every block
    v = explain(index, Question("conv-a", chain.keys(a, BS), len(a) + 1, 6 * BS, 0, 12.5, 11.0))
    assert v.cause == "cache_cleared" and v.held_tokens == 0 and v.agrees
    assert v.removed == ((0, 5, "cleared", 13.0, 13.0),)
    # The same batch without the clear: turn 2 found turn 1's blocks and stored the rest.
    index = ReplicaIndex()
    apply(index, [stored_event(ba[:6])], 10.0)
    apply(index, [stored_event(ba[6:])], 13.0)
    v = explain(index, Question("conv-a", chain.keys(a, BS), len(a) + 1, 6 * BS, 6 * BS, 12.5, 11.0))
    assert v.cause == "held" and v.held_tokens == 6 * BS and v.agrees


def test_index_memory_is_bounded_and_measured():
    index = ReplicaIndex(max_blocks=20_000)
    tokens = list(range(40_000 * 8))
    blocks = conv_blocks(tokens, 8)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(0, 20_000, 500):
        index.apply(Batch(0.0, [Stored([b[0] for b in blocks[i:i + 500]], blocks[i][1],
                                       [t for b in blocks[i:i + 500] for t in b[2]], 8)]), float(i))
    index.attribute([index.blocks[h].key for h in list(index.blocks)], "c")
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_block = used / 20_000
    assert per_block < 600, per_block  # ~290 B measured: held block, its log entry and owner
    assert used / 2 < index.approx_bytes() < used * 3  # the cheap estimate is the right size (it counts
    # the removal records to come: ~500 B per block once the pool has turned over)
    for i in range(20_000, 40_000, 500):  # twice the bound
        index.apply(Batch(0.0, [Stored([b[0] for b in blocks[i:i + 500]], blocks[i][1],
                                       [t for b in blocks[i:i + 500] for t in b[2]], 8)]), float(i))
    assert len(index.blocks) == 20_000 and index.forgotten >= 20_000


# -- pressure --------------------------------------------------------------------------------------------


def test_forecast_warns_when_two_conversations_do_not_fit():
    index = ReplicaIndex()
    p = Pressure(half_life_s=900, live_for_s=3600, rate_window_s=60)
    p.turn("a", 2000, 100.0)
    p.turn("b", 1500, 110.0)
    fc = {f.conversation: f for f in p.forecast(index, 4000, 111.0)}
    assert not fc["a"].will_be_evicted and fc["a"].ahead_tokens == 1500
    s = p.summary(index, 4000, 111.0)
    assert s["alert"] is None and s["working_set_tokens"] <= 3500
    p.turn("b", 2100, 120.0)
    fc = {f.conversation: f for f in p.forecast(index, 4000, 121.0)}
    assert fc["a"].will_be_evicted and fc["a"].margin_tokens == 4000 - 2000 - 2100
    assert not fc["b"].will_be_evicted
    s = p.summary(index, 4000, 121.0)
    assert s["alert"] is not None and s["alert"]["overflow_tokens"] > 0
    assert s["alert"]["options"]["cap_concurrent_long_sessions"] == 1
    assert s["forecast_evictions"] == 1


# -- the stream ------------------------------------------------------------------------------------------


@pytest.fixture
def publisher():
    pub = Publisher(topic="kv")
    yield pub
    pub.terminate()


async def _subscribed(pub: Publisher) -> Subscriber:
    sub = Subscriber("http://r", pub.endpoint, pub.replay_endpoint, "kv", ReplicaIndex())
    sub.start()
    await until(lambda: sub.state == "live", what="connected")
    # PUB/SUB joins late: publish a probe until one arrives (it is replayed if missed, as in production).

    def probed() -> bool:
        if sub.last_seq is None:
            pub.publish([])
        return sub.last_seq is not None

    await until(probed, what="a probe to arrive", interval=0.05)
    return sub


async def test_stream_applies_batches_in_order(publisher):
    sub = await _subscribed(publisher)
    try:
        a = list(range(1000, 1000 + 8 * BS))
        blocks = conv_blocks(a)
        publisher.publish([stored_event(blocks[:4])])
        last = publisher.publish([stored_event(blocks[4:])])
        await until(lambda: sub.last_seq == last, what="batches applied")
        assert sub.index.held_prefix(chain.keys(a, BS)) == 8
        assert sub.gaps == 0 and sub.snapshot()["state"] == "live"
    finally:
        await sub.stop()


async def test_gap_is_replayed(publisher):
    sub = await _subscribed(publisher)
    try:
        a = list(range(1000, 1000 + 8 * BS))
        blocks = conv_blocks(a)
        publisher.publish([stored_event(blocks[:4])], drop=True)  # lost on the way
        last = publisher.publish([stored_event(blocks[4:])])
        await until(lambda: sub.last_seq == last, what="gap filled")
        assert sub.gaps == 1 and sub.replayed == 1 and sub.unfilled == 0
        assert sub.index.held_prefix(chain.keys(a, BS)) == 8  # the replayed batch was applied first
    finally:
        await sub.stop()


async def test_gap_is_replayed_from_a_publisher_of_the_older_replay_format():
    pub = Publisher(topic="kv", legacy_replay=True)  # SGLang and vLLM before 0.11: (seq, payload) replies
    try:
        sub = await _subscribed(pub)
        try:
            a = list(range(1000, 1000 + 8 * BS))
            blocks = conv_blocks(a)
            pub.publish([stored_event(blocks[:4])], drop=True)
            last = pub.publish([stored_event(blocks[4:])])
            await until(lambda: sub.last_seq == last, what="gap filled")
            assert sub.replayed == 1 and sub.index.held_prefix(chain.keys(a, BS)) == 8
        finally:
            await sub.stop()
    finally:
        pub.terminate()


async def test_gap_without_replay_is_counted_and_verdicts_say_unknown():
    pub = Publisher(topic="kv", replay=False)
    try:
        sub = await _subscribed(pub)
        try:
            pub.publish([stored_event(conv_blocks(list(range(8))))], drop=True)
            last = pub.publish([])
            await until(lambda: sub.last_seq == last, what="jump seen")
            assert sub.gaps == 1 and sub.unfilled == 1 and sub.last_gap_at is not None
        finally:
            await sub.stop()
    finally:
        pub.terminate()


async def test_same_engine_after_a_disconnect_is_not_a_restart(publisher):
    sub = await _subscribed(publisher)
    try:
        a = list(range(1000, 1000 + 8 * BS))
        publisher.publish([stored_event(conv_blocks(a))])
        await until(lambda: sub.index.held_tokens == 8 * BS, what="stored")
        publisher.close()
        await until(lambda: sub.state == "lost", what="stream lost")
        b = list(range(3000, 3000 + 4 * BS))
        publisher.publish([stored_event(conv_blocks(b))])  # published while we were away (kept for replay)
        publisher.bind()  # the same process back (a network blip)
        await until(lambda: sub.index.held_prefix(chain.keys(b, BS)) == 4, what="missed batch replayed")
        assert sub.restarts == 0 and sub.index.held_prefix(chain.keys(a, BS)) == 8
    finally:
        await sub.stop()


async def test_restart_resets_the_index_and_loss_is_visible(publisher):
    sub = await _subscribed(publisher)
    try:
        a = list(range(1000, 1000 + 8 * BS))
        publisher.publish([stored_event(conv_blocks(a))])
        await until(lambda: sub.index.held_tokens == 8 * BS, what="stored")
        publisher.close()  # the engine dies
        await until(lambda: sub.state == "lost", what="stream lost")
        assert sub.disconnects >= 1
        publisher.seq = 0
        publisher.buffer.clear()
        b = list(range(7000, 7000 + 4 * BS))
        for _ in range(sub.last_seq + 3):  # the new process is already past our sequence number
            publisher.publish([])
        publisher.publish([stored_event(conv_blocks(b))])
        publisher.bind()  # a new engine process on the same ports
        await until(lambda: sub.restarts == 1, what="restart recognised")
        # Its replay buffer told: our index was reset and then learnt what the new process holds.
        await until(lambda: sub.index.held_prefix(chain.keys(b, BS)) == 4, what="caught up with the new process")
        assert sub.index.clears[-1][1] == "restarted" and sub.index.held_tokens == 4 * BS
        v = explain(sub.index, Question("a", chain.keys(a, BS), len(a) + 1, len(a), 0, time.time(), 0.5))
        assert v.cause == "engine_restarted"
    finally:
        await sub.stop()


# -- routing: where a new conversation's prefix is actually held -------------------------------------------


def test_boundaries_find_the_replica_that_holds_the_prefix():
    from gateway.kvevents.placement import Boundaries
    from gateway.routing import prefix_index

    messages = [{"role": "system", "content": "S" * 40}, {"role": "user", "content": "U" * 40},
                {"role": "assistant", "content": "A" * 40}, {"role": "user", "content": "again"}]
    tokens = list(range(10, 10 + 10 * BS))
    ends = [3 * BS + 1, 6 * BS, 9 * BS + 2, 10 * BS]  # render tokens through each message
    keys = chain.keys(tokens, BS)
    head = prefix_index.seed("lane", "t", True, 50, None)
    b = Boundaries()
    b.note("lane", messages, head, ends, keys, BS)
    near, far = ReplicaIndex(), ReplicaIndex()
    blocks = conv_blocks(tokens)
    apply(near, [stored_event(blocks[:6])], 1.0)  # holds the prefix through message 1 only
    apply(far, [stored_event(blocks)], 1.0)  # holds all of it
    follow_up = messages[:3] + [{"role": "user", "content": "a new question"}]
    held = b.held("lane", follow_up, head, {"near": near, "far": far})
    assert held == {"near": (1, 6 * BS), "far": (2, 9 * BS)}
    apply(far, [removed([h for h, _, _ in blocks[6:]])], 2.0)  # far's pool let the tail go
    assert b.held("lane", follow_up, head, {"near": near, "far": far})["far"] == (1, 6 * BS)
    other_head = prefix_index.seed("lane", "t", True, 75, None)  # another effort renders another head
    assert b.held("lane", follow_up, other_head, {"near": near, "far": far}) == {}


async def test_subscribing_late_catches_up_from_the_replay_buffer(publisher):
    a = list(range(1000, 1000 + 8 * BS))
    publisher.publish([stored_event(conv_blocks(a))])  # before anyone listens: the engine ran before the gateway
    sub = await _subscribed(publisher)
    try:
        await until(lambda: sub.index.held_prefix(chain.keys(a, BS)) == 8, what="caught up")
        assert sub.gaps == 0 and sub.unfilled == 0 and sub.index.orphans == 0
    finally:
        await sub.stop()


async def test_an_address_that_cannot_be_bound_is_an_error_state_not_a_dead_task(publisher):
    # The publisher already binds its endpoint: a subscriber told to bind it too cannot.
    sub = Subscriber("http://r", publisher.endpoint, None, "kv", ReplicaIndex(), bind=True)
    sub.start()
    try:
        await until(lambda: sub.state == "error", what="error state")
        assert "Address already in use" in (sub.snapshot()["last_error"] or "")
    finally:
        await sub.stop()


# -- the service: pools with room, for re-homing ---------------------------------------------------------


async def test_rehoming_prefers_the_pool_with_room():
    from gateway.core.config import parse_routes
    from gateway.kvevents.service import KVEventsService
    from types import SimpleNamespace

    from gateway.core.exchange import Exchange
    from gateway.core.runtime import Runtime
    from gateway.routing import make_policy
    from gateway.routing.conversation_affinity import ConversationAffinity
    from gateway.routing.load import LoadBoard
    from gateway.routing.shared import RoutingShared

    pubs = [Publisher(topic="kv"), Publisher(topic="kv"), Publisher(topic="kv")]
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"]
    kv = {u: {"endpoint": p.endpoint, "replay": p.replay_endpoint, "topic": "kv", "pool_tokens": 10_000}
          for u, p in zip(urls, pubs)}
    config = parse_routes(json.dumps({  # JSON is YAML
        "lanes": {"l": {"replicas": urls, "upstream_model": "m", "kv_events": {"replicas": kv},
                        "affinity": {"prefix_source": "kv_events"}}},
        "models": {"m": "l"}}))
    runtime = Runtime(config, make_router=make_policy)
    service = KVEventsService(runtime)
    await service.start()
    try:
        await until(lambda: all(r.subscriber.healthy for r in service.replicas.values()), what="live")
        now = time.time()
        # Replica 2 is nearly full of live conversations, replica 3 has room; the conversation needs 3,000.
        service.replicas[("l", urls[1])].pressure.turn("big", 9_000, now)
        service.replicas[("l", urls[2])].pressure.turn("small", 1_000, now)
        service.replicas[("l", urls[0])].pressure.turn("moving", 3_000, now)
        assert service.room("l", urls[1]) < 3_000 <= service.room("l", urls[2])
        policy = ConversationAffinity()
        policy.bind(RoutingShared(None, LoadBoard(None)), "l", config.lanes["l"].affinity)
        policy.shared.kv = service
        replicas = runtime.snapshot.lanes["l"].upstream.replicas
        # The conversation's home, replica 1, is overloaded: it is re-homed.
        replicas[0].inflight = 10
        ex = Exchange("r")
        ex.conversation = SimpleNamespace(state=SimpleNamespace(id="moving", turn=3, replica=urls[0], last=None),
                                          is_new=False)
        # Least loaded alone would pick replica 2 (listed first, equally idle): the pool with room wins.
        chosen = policy.order(replicas, ex)[0]
        assert chosen.url == urls[2] and ex.routing.reason == "rehomed_overload", ex.routing
        assert ex.routing.room is not None and ex.routing.room.needed == 3_000, ex.routing
    finally:
        await service.stop()
        for p in pubs:
            p.terminate()


# -- a hostile publisher: malformed events counted, logged and skipped; huge batches in slices ---------

# Values of every type a field can be given, the edges included.
ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(allow_nan=True),
    st.text(max_size=8), st.binary(max_size=40),
    st.lists(st.integers(-(1 << 40), 1 << 40), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(-9, 9), max_size=2),
)
HASH = st.one_of(st.binary(min_size=1, max_size=40), st.integers(-(1 << 63), (1 << 64) - 1), ANY)
FIELDS = {
    "block_hashes": st.one_of(st.lists(HASH, max_size=4), ANY),
    "parent_block_hash": st.one_of(st.none(), HASH),
    "token_ids": st.one_of(st.lists(st.integers(0, 1 << 20), max_size=2 * BS), st.lists(ANY, max_size=3), ANY),
    "block_size": st.one_of(st.just(BS), ANY),
    "lora_id": st.one_of(st.none(), ANY),
    "medium": st.one_of(st.none(), st.sampled_from(["GPU", "CPU"]), ANY),
    "extra_keys": st.one_of(st.none(), ANY),
    "group_idx": st.one_of(st.none(), st.just(0), ANY),
}
KINDS = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"]) | st.text(max_size=5)


@st.composite
def event(draw):
    kind = draw(KINDS)
    values = {name: draw(strategy) for name, strategy in FIELDS.items() if draw(st.booleans())}
    if draw(st.booleans()):  # vLLM >= 0.11: a map
        return {"type": kind, **values}
    order = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"]
    return [kind, *(values.get(name) for name in order)]  # SGLang and older vLLM: a tagged array


BATCHES = st.one_of(
    st.lists(event(), max_size=6).map(encode),
    st.builds(lambda ts, evs: msgpack.packb([ts, evs]), ANY, st.lists(event(), max_size=3)),
    st.builds(msgpack.packb, ANY),
    st.binary(max_size=60),
)


@settings(max_examples=1500, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(BATCHES)
def test_any_payload_decodes_or_is_refused_and_any_decoded_batch_applies(payload):
    try:
        batch = decode_batch(payload)
    except BadPayload:
        return  # refused, as a whole
    assert isinstance(batch, Batch) and batch.bad >= 0 and batch.skipped >= 0
    index = ReplicaIndex()
    index.apply(batch, 1.0)
    books = index.counters()
    # Applied: a fresh index holds no more blocks than the batch stored, and never fewer than none.
    assert 0 <= books["held_blocks"] <= books["stored_blocks"] and books["held_tokens"] >= 0, books


async def test_a_hostile_publisher_never_stops_the_subscriber(publisher):
    sub = await _subscribed(publisher)
    try:
        topic = publisher.topic
        seq = publisher.seq
        bad = [
            encode([{"type": "BlockStored", "block_hashes": 5, "token_ids": [1], "block_size": BS}]),
            encode([{"type": "BlockStored", "block_hashes": [b"h"], "token_ids": "abc", "block_size": BS}]),
            encode([{"type": "BlockStored", "block_hashes": [b"y"], "token_ids": [1 << 40] * BS, "block_size": BS}]),
            encode([{"type": "BlockRemoved", "block_hashes": {"a": 1}}]),
            encode([["BlockStored", [b"x"], None, [-1] * BS, BS]]),
        ]
        for payload in bad:
            publisher.publish_raw([topic, seq.to_bytes(8, "big"), payload])
            seq += 1
        publisher.publish_raw([topic, (1 << 100).to_bytes(13, "big"), encode([])])  # an oversized sequence number
        publisher.publish_raw([topic, (-5).to_bytes(8, "big", signed=True), encode([])])  # a negative one
        publisher.publish_raw([topic, b"\x00", b"\x01"])
        publisher.seq = seq
        await until(lambda: sub.last_seq == seq - 1, what="the malformed batches passed")
        a = list(range(5000, 5000 + 4 * BS))
        last = publisher.publish([stored_event(conv_blocks(a))])
        await until(lambda: sub.last_seq == last, what="the good batch after them applied")
        assert sub.index.held_prefix(chain.keys(a, BS)) == 4
        snap = sub.snapshot()
        assert snap["state"] == "live" and snap["bad_events"] == len(bad) and snap["bad_payloads"] >= 3
        assert snap["restarts"] == 0 and snap["apply_errors"] == 0
        orjson.dumps(snap)  # what /admin/api/kv serves
    finally:
        await sub.stop()


async def test_a_huge_batch_is_applied_in_slices(publisher):
    sub = await _subscribed(publisher)
    try:
        n = 200_000
        events = [stored([i.to_bytes(8, "big")], None, list(range(BS)), BS) for i in range(n)]
        ticks = 0
        stop = False

        async def ticker() -> None:
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)  # one turn of the loop: the ticker counts them

        task = asyncio.create_task(ticker())
        before = sub.events
        last = publisher.publish(events)
        await until(lambda: sub.last_seq == last, timeout=120, what="the huge batch applied")
        stop = True
        await task
        assert sub.events - before == n
        # The loop ran between the slices (at least once per slice), not only before and after.
        assert ticks >= n // 2_000, ticks
    finally:
        await sub.stop()


# -- the service's judge: a long prompt walked off the event loop, the same verdict as on it -------------


async def test_a_long_turn_is_judged_off_the_loop_with_the_verdict_of_the_loop():
    from gateway.conversations.job import Outcome
    from gateway.conversations.state import ConversationState
    from gateway.core.config import parse_routes
    from gateway.core.exchange import Exchange
    from gateway.core.runtime import Runtime
    from gateway.core.verdict import CacheVerdict
    from gateway.kvevents.service import LOOP_MAX_KEYS, KVEventsService
    from gateway.routing import make_policy

    bs, n_blocks = 16, LOOP_MAX_KEYS + 1000
    pub = Publisher(topic="kv")
    url = "http://127.0.0.1:9001"
    config = parse_routes(json.dumps({"lanes": {"l": {
        "replicas": [url], "upstream_model": "m", "cache": {"block_size": bs},
        "kv_events": {"replicas": {url: {"endpoint": pub.endpoint, "replay": pub.replay_endpoint, "topic": "kv",
                                         "pool_tokens": 1 << 24}}}}}, "models": {"m": "l"}}))
    runtime = Runtime(config, make_router=make_policy)
    service = KVEventsService(runtime)
    await service.start()
    try:
        r = service.replicas[("l", url)]
        await until(lambda: r.subscriber.healthy, what="live")
        tokens = list(range(1, n_blocks * bs + 1))
        hashes = [i.to_bytes(8, "little") for i in range(1, n_blocks + 1)]
        # The prompt's blocks, then all but its last 100 evicted by someone else's.
        for s in range(0, n_blocks, 500):
            pub.publish([stored(hashes[s:s + 500], hashes[s - 1] if s else None, tokens[s * bs:(s + 500) * bs], bs)])
        await until(lambda: r.index.held_tokens == n_blocks * bs, what="stored")
        pub.publish([removed(hashes[-100:])])
        await until(lambda: r.index.held_tokens == (n_blocks - 100) * bs, what="removed")
        keys = chain.keys(tokens, bs)
        lane = runtime.snapshot.lanes["l"]

        async def judged(blocks: int, other_events: bool) -> CacheVerdict:
            prompt = blocks * bs + 1
            ex = Exchange("r", replica=url)
            cache = CacheVerdict("eviction", blocks * bs, (blocks - 100) * bs, rendered_prompt_tokens=prompt)
            outcome = Outcome(cache, 2, b"", None, None, array_bytes(keys[:blocks]), None)
            state = ConversationState(f"c{blocks}", "header", turn=1)
            task = asyncio.ensure_future(service.judge(ex, lane, state, outcome))
            if other_events:  # published while the walk runs: applied after it, never during it
                pub.publish([stored([b"other"], None, [7] * bs, bs)])
            await task
            return cache

        long_, short = await judged(n_blocks, True), await judged(LOOP_MAX_KEYS, False)
        assert long_.kv is not None and long_.kv.evidence is not None and short.kv is not None
        assert long_.kv.evidence["held_tokens"] == (n_blocks - 100) * bs and long_.kv.evidence["agrees"] is True
        assert short.kv.evidence is not None and short.kv.evidence["held_tokens"] == LOOP_MAX_KEYS * bs
        await until(lambda: r.index.held_tokens == (n_blocks - 100 + 1) * bs, what="the other store applied")
        assert (service.overview()["judged"], service.overview()["judged_off_loop"]) == (2, 1)
    finally:
        await service.stop()
        pub.terminate()


def array_bytes(keys: list[int]) -> bytes:
    from array import array

    return array("Q", keys).tobytes()
