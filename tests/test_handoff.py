"""A large body handed to the analysis worker through shared memory (gateway/conversations/handoff.py):
the ring never lets two live bodies overlap, the worker reads back exactly what was put, a body that
does not fit goes the old way (pickled), and through a real gateway a large conversation's turns get
the same verdicts with the ring as without it."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pipeline.body_parts import Parts
from gateway.conversations import handoff
from gateway.conversations.handoff import BodyRing, InRing
from tests.support.conversations import Agent
from tests.support.gateway_proc import run_gateway
from tests.support.routes import agent_routes

RING = 4096


def _body(i: int, n: int) -> bytes:
    return bytes((i * 7 + k) % 251 for k in range(n))


# Each step: put a body of that size (a positive number), or free the k-th live body (a negative one).
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=-8, max_value=RING + 64), min_size=1, max_size=60),
       st.booleans())
def test_live_bodies_never_overlap_and_read_back_exactly(ops: list[int], in_parts: bool) -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        ring = BodyRing(d, RING)
        live: list[tuple[InRing, bytes]] = []
        for i, op in enumerate(ops):
            if op <= 0:
                if live:
                    ref, _ = live.pop((-op) % len(live))
                    ring.free(ref)
                continue
            data = _body(i, op)
            body = Parts((data[:op // 3], memoryview(data)[op // 3:op // 2], data[op // 2:])) if in_parts else data
            ref = ring.put(body)
            spans = sorted((r.offset, r.offset + r.size) for r, _ in live)
            if ref is None:
                # It may not fit only when no free gap (after the newest, or before the oldest) holds it.
                assert op > RING or spans, (op, spans)
                continue
            assert 0 <= ref.offset and ref.offset + ref.size <= RING and ref.size == op
            for a, b in spans:
                assert ref.offset >= b or ref.offset + ref.size <= a, (ref, spans)
            live.append((ref, data))
            for r, expected in live:  # nothing written since has touched the live bodies
                assert handoff.take(r) == expected
        for ref, _ in live:
            ring.free(ref)
        assert ring.held == 0 and ring.put(_body(0, RING)) is not None  # all freed: the whole ring again
        ring.close()
        mapped = handoff._maps.pop(ring.path, None)  # the worker's map of it (the next example's file is another)
        if mapped is not None:
            mapped.close()


def test_what_a_job_carries() -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        ring = BodyRing(d, 1 << 20)
        big = _body(1, handoff.MIN_BYTES)
        parts = Parts((big[:10], memoryview(big)[10:]))
        ref = handoff.pack(parts, ring)
        assert isinstance(ref, InRing) and handoff.take(ref) == big
        assert handoff.pack(big[:100], ring) == big[:100]  # small: in the job's own pickle
        assert handoff.pack(parts, None) == big  # no ring: joined (a memoryview does not pickle)
        assert handoff.pack({"messages": []}, ring) == {"messages": []}  # parsed (threads): as it is
        too_big = _body(2, (1 << 20) + 1)
        assert handoff.pack(too_big, ring) is too_big and ring.fallbacks == 1
        ring.close()
        handoff._maps.pop(ring.path).close()


@pytest.mark.parametrize("ring_mb", ["32", "0.01"])  # the ring, and a ring too small: every body pickled
def test_a_large_conversation_is_analysed_through_the_ring_or_without_it(agent_emu, ring_mb: str) -> None:
    with run_gateway(agent_routes(agent_emu.url), env={"GATEWAY_ANALYSIS_RING_MB": ring_mb}) as gw:
        agent = Agent(gw)
        agent.messages[0]["content"] += " Keep this in mind." * 5000  # ~95 KB: above handoff.MIN_BYTES
        agent.cold_then_hits(3)
        assert "analysis failed" not in gw.log()


def test_a_ring_without_room_is_refused_whole() -> None:
    # More than the filesystem holds: refused when created (the pickle way is used), no file left,
    # rather than a SIGBUS when a later write first touches a page tmpfs cannot give.
    with tempfile.TemporaryDirectory() as directory:
        free = os.statvfs(directory)
        assert BodyRing.create(directory, free.f_bavail * free.f_frsize // 2**20 + 1024) is None
        assert os.listdir(directory) == []
