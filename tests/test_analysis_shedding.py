"""When analysis falls behind, it is shed per conversation, never silently (gateway/observe/aftermath.py).

The queue holds one place in line per conversation, with up to `coalesce` of its turns: a newer turn
waits with its older ones and all are analysed in order; beyond `coalesce`, the oldest waiting turn
is recorded with analysis `superseded`; a full queue sheds a new conversation's turn (`queue_full`).
Both are counted (gateway_analysis_shed{reason}) and the record says why.
"""

from __future__ import annotations

import asyncio
import json

from gateway.observe.aftermath import Aftermath
from gateway.conversations.found import Found
from gateway.conversations.state import ConversationState
from gateway.core.exchange import Exchange
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.metrics import metric_samples
from tests.support.records import SENT, post, records
from tests.support.routes import emulator_lane, routes
from tests.support.poll import until


def _turn(cid: str, n: int) -> Exchange:
    ex = Exchange(request_id=f"{cid}{n}", path="/v1/chat/completions")
    ex.conversation = Found(ConversationState(cid, "key"), None, False, None, None)  # type: ignore[arg-type]
    return ex


async def test_the_latest_turn_of_each_conversation_is_analysed_first() -> None:
    """coalesce=1 (one turn per conversation): a newer turn takes its older one's place."""
    gate = asyncio.Event()
    analysed: list[str] = []
    sunk: dict[str, str | None] = {}

    async def analysis(ex, lane) -> None:
        await gate.wait()
        analysed.append(ex.request_id)

    am = Aftermath(analyzers=[analysis], sinks=[lambda ex, lane: sunk.__setitem__(ex.request_id, ex.analysis_skipped)],
                   workers=1, max_queue=3, coalesce=1)
    am.start()
    try:
        am.exchange_ended(_turn("A", 1), None)
        await asyncio.sleep(0)  # one turn of the loop, the scenario: the worker takes A1 and waits in its analysis
        for ex in (_turn("A", 2), _turn("B", 1), _turn("A", 3), _turn("C", 1), _turn("D", 1), _turn("C", 2)):
            am.exchange_ended(ex, None)
        await until(lambda: len(sunk) >= 3, what="the shed turns at the sinks")
        # A2 and C1 gave way to their conversations' newer turns; D1 found the queue full (A, B, C).
        assert sunk == {"A2": "superseded", "C1": "superseded", "D1": "queue_full"}
        assert (am.shed_superseded, am.shed_queue_full, am.skipped_analysis) == (2, 1, 3)
        gate.set()
        assert await am.drain(5)
        assert analysed == ["A1", "A3", "B1", "C2"], "a newer turn takes the older one's place in line"
        assert all(sunk[r] is None for r in analysed) and len(sunk) == 7, "every exchange reaches the sinks once"
        assert am.queued_bytes == 0 and am.queued == 0
    finally:
        await am.stop()


async def test_a_conversations_waiting_turns_are_analysed_together_in_order() -> None:
    """coalesce=2: a conversation's turns wait together in its place in line and are all analysed,
    in order; a third waiting turn sheds the oldest (superseded), never silently."""
    gate = asyncio.Event()
    analysed: list[str] = []
    sunk: dict[str, str | None] = {}

    async def analysis(ex, lane) -> None:
        await gate.wait()
        analysed.append(ex.request_id)

    am = Aftermath(analyzers=[analysis], sinks=[lambda ex, lane: sunk.__setitem__(ex.request_id, ex.analysis_skipped)],
                   workers=1, max_queue=3, coalesce=2)
    am.start()
    try:
        am.exchange_ended(_turn("A", 1), None)
        await asyncio.sleep(0)  # one turn of the loop, the scenario: the worker takes A1 and waits in its analysis
        for ex in (_turn("A", 2), _turn("B", 1), _turn("A", 3), _turn("C", 1), _turn("D", 1), _turn("C", 2),
                   _turn("A", 4)):
            am.exchange_ended(ex, None)
        await until(lambda: len(sunk) >= 2, what="the shed turns at the sinks")
        # A2 gave way when A4 came (A3, A4 wait); C1, C2 wait together; D1 found the queue full (A, B, C).
        assert sunk == {"A2": "superseded", "D1": "queue_full"}
        assert (am.shed_superseded, am.shed_queue_full) == (1, 1)
        assert am.queued == 5
        gate.set()
        assert await am.drain(5)
        assert analysed == ["A1", "A3", "A4", "B1", "C1", "C2"], "a conversation's turns in order, in its place in line"
        assert all(sunk[r] is None for r in analysed) and len(sunk) == 8, "every exchange reaches the sinks once"
        assert am.queued_bytes == 0 and am.queued == 0
    finally:
        await am.stop()


async def test_past_max_coalesced_a_newer_turn_takes_the_oldest_ones_place() -> None:
    """All conversations together hold at most `max_coalesced` turns beyond their first: past it a
    newer turn supersedes its conversation's oldest waiting turn instead of joining it."""
    gate = asyncio.Event()
    analysed: list[str] = []
    sunk: dict[str, str | None] = {}

    async def analysis(ex, lane) -> None:
        await gate.wait()
        analysed.append(ex.request_id)

    am = Aftermath(analyzers=[analysis], sinks=[lambda ex, lane: sunk.__setitem__(ex.request_id, ex.analysis_skipped)],
                   workers=1, coalesce=4, max_coalesced=1)
    am.start()
    try:
        am.exchange_ended(_turn("X", 1), None)
        await asyncio.sleep(0)  # one turn of the loop, the scenario: the worker takes X1 and waits in its analysis
        for ex in (_turn("A", 1), _turn("A", 2), _turn("B", 1), _turn("B", 2), _turn("A", 3)):
            am.exchange_ended(ex, None)
        await until(lambda: len(sunk) >= 2, what="the shed turns at the sinks")
        # A2 joined A1 (one coalesced turn: the limit); B2 then took B1's place, A3 A1's.
        assert sunk == {"B1": "superseded", "A1": "superseded"}
        gate.set()
        assert await am.drain(5)
        assert analysed == ["X1", "A2", "A3", "B2"]
        assert am.queued_bytes == 0 and am.queued == 0
        # Nothing is left counted as coalesced: a new conversation's second turn joins its first again.
        for ex in (_turn("E", 1), _turn("E", 2)):
            am.exchange_ended(ex, None)
        assert await am.drain(5)
        assert analysed[-2:] == ["E1", "E2"] and sunk["E1"] is None and sunk["E2"] is None, (analysed, sunk)
    finally:
        await am.stop()


async def test_a_slow_analysis_holds_back_only_the_sinks_of_turns_taken_after_it() -> None:
    """Workers never wait for each other's analysis (the analysis process then always has work):
    while one turn's analysis is slow, the turns taken after it are analysed, and their sinks wait
    to run in the order the turns were taken."""
    slow = asyncio.Event()
    analysed: list[str] = []
    sunk: list[str] = []

    async def analysis(ex, lane) -> None:
        if ex.request_id == "A1":
            await slow.wait()
        analysed.append(ex.request_id)

    am = Aftermath(analyzers=[analysis], sinks=[lambda ex, lane: sunk.append(ex.request_id)], workers=2)
    am.start()
    try:
        for ex in (_turn("A", 1), _turn("B", 1), _turn("C", 1), _turn("D", 1)):
            am.exchange_ended(ex, None)
        # The other worker goes on through B1, C1, D1 while A1's analysis waits.
        await until(lambda: len(analysed) == 3, what="B1, C1 and D1 analysed")
        assert analysed == ["B1", "C1", "D1"] and sunk == [], "analysed; their records wait for A1's"
        slow.set()
        assert await am.drain(5)
        assert analysed[-1] == "A1" and sunk == ["A1", "B1", "C1", "D1"], "sinks in the order taken"
        assert am.processed == 4 and am.queued_bytes == 0 and not am._ready
    finally:
        await am.stop()


def _three_quick_turns_behind_a_big_one(env: dict[str, str]) -> tuple[list[str], dict[str, dict], dict]:
    """One aftermath worker busy with a big new conversation's analysis (~0.5 s of render and
    tokenisation) while a small conversation sends three quick turns: their request ids, their
    records (written once analysed, or shed) and the shed counters."""
    with run_emulator(flavour="vllm", max_model_len=1 << 20) as emu:
        with run_gateway(routes({"v": emulator_lane(emu.url)}, {"m": "v"}, max_request_bytes=16 << 20),
                         env=env) as gw:
            big = [{"role": "user" if i % 2 == 0 else "assistant",
                    "content": " ".join(f"word{i}x{j}" for j in range(150))} for i in range(801)]
            assert post(gw.url, {"model": "m", "messages": big, "max_tokens": 2,
                                 "prompt_cache_key": "big"})[0] == 200
            mark = len(SENT[gw.url])
            msgs = [{"role": "user", "content": "hello"}]
            for _ in range(3):
                status, raw = post(gw.url, {"model": "m", "messages": msgs, "max_tokens": 2,
                                            "prompt_cache_key": "small"})
                assert status == 200
                answer = json.loads(raw)["choices"][0]["message"]
                msgs = [*msgs, {"role": "assistant", "content": answer.get("content") or ""},
                        {"role": "user", "content": "go on"}]
            ids = SENT[gw.url][mark:]
            by_id = {r["request_id"]: r for r in records(gw.url, ids)}
            return ids, by_id, metric_samples(gw.url)["gateway_analysis_shed_total"]


def test_shed_turns_are_recorded_with_why_and_counted() -> None:
    """One worker busy with a big new conversation's analysis (~0.5 s of render and tokenisation)
    while a small conversation sends three quick turns; one turn per conversation waits
    (GATEWAY_AFTERMATH_COALESCE=1): the first two are superseded, the third is analysed; the
    records and /metrics say so."""
    env = {"GATEWAY_AFTERMATH_WORKERS": "1", "GATEWAY_AFTERMATH_COALESCE": "1"}
    ids, by_id, shed = _three_quick_turns_behind_a_big_one(env)
    assert [by_id[i]["analysis"] for i in ids] == ["superseded", "superseded", None], [by_id[i] for i in ids]
    assert by_id[ids[2]]["verdict"] != "unknown", "the conversation's latest turn got its verdict"
    assert shed[(("reason", "superseded"),)] >= 2 and (("reason", "queue_full"),) in shed


def test_quick_turns_of_a_conversation_each_get_their_verdict() -> None:
    """As above, with the default coalescing: the three quick turns wait together behind the big
    analysis and each is analysed, in order, with its own verdict; nothing is shed."""
    env = {"GATEWAY_AFTERMATH_WORKERS": "1"}
    ids, by_id, shed = _three_quick_turns_behind_a_big_one(env)
    assert [by_id[i]["analysis"] for i in ids] == [None, None, None], [by_id[i] for i in ids]
    # The first turn: cold, or judged against the head the big conversation left on the replica.
    assert by_id[ids[0]]["verdict"] in ("cold", "hit", "eviction") and \
        all(by_id[i]["verdict"] != "unknown" for i in ids[1:]), [by_id[i]["verdict"] for i in ids]
    assert shed.get((("reason", "superseded"),), 0) == 0
