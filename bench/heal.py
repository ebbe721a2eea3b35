#!/usr/bin/env python3
"""Drift healing's cost on the hot path, for the ~1,600-message corpus body (784 assistant messages).

A conversation's last turns are replayed (each request the previous one plus the next assistant message
and its tool result: the body ends at 1,600 messages). Every turn is sent three times on the same body,
in an order that rotates: heal on, heal off, and heal off again, the control (how far apart two
identical requests measure). Each request is the in-process hot path around the heal step as the
pipeline runs it: the body parsed (through the pipeline's history memo), the step, the body serialised
for upstream (the history's own bytes when nothing replaced the messages), the body freed. Printed:
the median over turns of (on - off), wall and CPU, with a 95% bootstrap interval, beside the control's;
and the step alone. Two clients:

  heals     an agent that sorts every call's argument keys and strips every reasoning: each of the
            784 assistant messages gets two repairs, every turn;
  clean     the same session sent back exactly as relayed: nothing to repair;

and `first`: the step alone when this process never saw the conversation's previous request (a
restart, another gateway process): every message looked up and planned.

    python bench/heal.py [--rounds 150]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.core.config import Lane  # noqa: E402
from gateway.conversations.effort import EffortChoice  # noqa: E402
from gateway.conversations.identity import lineage  # noqa: E402
from gateway.conversations.found import Found  # noqa: E402
from gateway.conversations.state import ConversationState  # noqa: E402
from gateway.core.exchange import Exchange  # noqa: E402
from gateway.observe.gc_tuning import settle  # noqa: E402
from gateway.heal.base import Relayed, heal_digest  # noqa: E402
from gateway.heal.book import RelayedBook  # noqa: E402
from gateway.heal.policy import HealPolicy  # noqa: E402
from gateway.pipeline.history_memo import HistoryMemo  # noqa: E402
from gateway.store.memory import MemoryStore  # noqa: E402

SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
KINDS = ["arguments", "reasoning", "content", "tool_result_order", "reasoning_field"]


def corpus(path: Path) -> dict:
    if not path.exists():
        subprocess.run([sys.executable, str(SHARED / "tools" / "make_agent_corpus.py"), "-o", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


def drifted(body: dict) -> dict:
    out = copy.deepcopy(body)
    for m in out["messages"]:
        m.pop("reasoning_content", None)
        for c in m.get("tool_calls") or ():
            c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), sort_keys=True)
    return out


def lane(kinds: list[str]) -> SimpleNamespace:
    cfg = Lane(replicas=["http://127.0.0.1:1"], upstream_model="m", heal=kinds)
    return SimpleNamespace(name="ds", config=cfg)


def exchange(body: dict, cid: str) -> Exchange:
    ex = Exchange("bench")
    ex.thinking_applied = True
    state = ConversationState(cid, "lineage", lane="ds", turn=5)
    ex.conversation = Found(state, lineage(body["messages"]), False, 5, EffortChoice(True, None, None))
    return ex


def session(body: dict, book: RelayedBook) -> None:
    """Every assistant message of the session, as the gateway relayed it (what turn_end.py records)."""
    for m in body["messages"]:
        if m["role"] == "assistant":
            book.remember("default", heal_digest(m), Relayed.from_message(m))


async def request(policy: HealPolicy, memo: HistoryMemo, lane_rt, raw: bytes,
                  cid: str) -> tuple[float, float, float, int]:
    """One request's in-process hot path around the heal step, as the pipeline runs it: the body parsed
    (through the history memo: the unchanged history is last turn's objects), the step, the body
    serialised for upstream (the history's own bytes when no policy replaced the messages, else
    orjson), the body freed (and what the step deferred run). Returns (wall ms, CPU ms, the step's own
    wall ms, repairs)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    parsed = memo.parse(raw)
    body = parsed.data
    ex = exchange(body, cid)
    s0 = time.perf_counter()
    await policy.apply(ex, lane_rt, body)
    s1 = time.perf_counter()
    up = dict(body)
    up["model"] = "m"
    out = HistoryMemo.serialise(parsed, up) or orjson.dumps(up)
    repairs = sum(len(h.indices) for h in ex.healed)
    del body, ex, out, up
    memo.settle(parsed)
    del parsed
    await asyncio.sleep(0)  # the step's deferred frees (call_soon) run here
    return (time.perf_counter() - w0) * 1000, (time.thread_time() - c0) * 1000, (s1 - s0) * 1000, repairs


async def paired(policy: HealPolicy, memo: HistoryMemo, on, off, client: dict, cid: str, rounds: int,
                 passes: int = 3) -> dict:
    """`rounds` turns, in `passes` replays of the conversation's last turns (a new conversation id each:
    the step's memory starts from the request before them, as a serving gateway's would)."""
    on_w, off_w, ctl_w, on_c, off_c, ctl_c, step, repairs = [], [], [], [], [], [], [], 0
    messages = client["messages"]
    per = -(-rounds // passes)
    for p in range(passes):
        key = f"{cid}-{p}"
        ends = [len(messages) - 2 * k for k in range(per, -1, -1)]
        body = dict(client, messages=messages[:ends[0]])  # the turn before them (not timed)
        await request(policy, memo, on, orjson.dumps(body), key)
        for i, end in enumerate(ends[1:]):
            raw = orjson.dumps(dict(client, messages=messages[:end]))
            await asyncio.sleep(0.002)  # a fresh scheduler slice for each turn
            results = {}
            for which in ("on", "off", "ctl")[i % 3:] + ("on", "off", "ctl")[:i % 3]:
                results[which] = await request(policy, memo, on if which == "on" else off, raw, key)
            on_w.append(results["on"][0] - results["off"][0])
            ctl_w.append(results["ctl"][0] - results["off"][0])
            on_c.append(results["on"][1] - results["off"][1])
            ctl_c.append(results["ctl"][1] - results["off"][1])
            off_w.append(results["off"][0])
            off_c.append(results["off"][1])
            step.append(results["on"][2])
            repairs = results["on"][3]
    return {"added_ms": med(on_w), "added_ci": ci(on_w), "control_ms": med(ctl_w), "control_ci": ci(ctl_w),
            "added_cpu_ms": med(on_c), "added_cpu_ci": ci(on_c), "control_cpu_ms": med(ctl_c),
            "control_cpu_ci": ci(ctl_c), "request_ms": med(off_w), "request_cpu_ms": med(off_c),
            "step_ms": med(step), "step_p90_ms": round(pct(step, 0.9), 3), "repairs": repairs,
            "turns": len(step)}


async def first(policy: HealPolicy, on, cur: bytes, rounds: int) -> dict:
    """The step alone when this process never saw the conversation's previous request (a restart,
    another gateway process): every message looked up and planned."""
    times = []
    for i in range(rounds):
        body = orjson.loads(cur)
        ex = exchange(body, f"first-{i}")
        await asyncio.sleep(0.002)
        t0 = time.perf_counter()
        await policy.apply(ex, on, body)
        times.append((time.perf_counter() - t0) * 1000)
    return {"step_ms": med(times), "rounds": rounds}


def med(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def ci(values: list[float], draws: int = 1000) -> tuple[float, float]:
    """95% bootstrap interval of the median (seeded: the same figures give the same interval)."""
    rng = random.Random(7)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return round(meds[int(0.025 * draws)], 3), round(meds[int(0.975 * draws)], 3)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def main_async(args: argparse.Namespace) -> None:
    body = corpus(Path(args.corpus))
    book = RelayedBook(MemoryStore(), 3600)
    session(body, book)
    await asyncio.sleep(0)
    policy = HealPolicy(book)
    settle()  # the gateway's own collector settings (gc_tuning.py), as in a serving process
    bad = drifted(body)
    enc = orjson.dumps
    on, off = lane(KINDS), lane([])
    rows = {
        "heals": await paired(policy, HistoryMemo(), on, off, bad, "heals", args.rounds),
        "clean": await paired(policy, HistoryMemo(), on, off, body, "clean", args.rounds),
        "first": await first(policy, on, enc(bad), max(10, args.rounds // 10)),
    }
    n = len(body["messages"])
    low = n - 2 * -(-args.rounds // 3)
    print(f"heal on the corpus body: {n} messages, {sum(m['role'] == 'assistant' for m in body['messages'])} "
          f"assistant, {len(enc(body)) / 1e6:.2f} MB; its last turns replayed (bodies of {low}-{n} messages), "
          f"{rows['clean']['turns']} turns per client, three requests per turn (parse, step, serialise, free)")
    print("  added = median over turns of (heal on - heal off) on the same body; control = (heal off - heal off),")
    print("  how far apart two identical requests measure; (95% interval of the median)")
    for name in ("heals", "clean"):
        r = rows[name]
        print(f"  {name:5}  added {r['added_ms']:6.3f} ms {r['added_ci']}  cpu {r['added_cpu_ms']:6.3f} ms "
              f"{r['added_cpu_ci']}  | control {r['control_ms']:6.3f} ms {r['control_ci']}  cpu "
              f"{r['control_cpu_ms']:6.3f} ms {r['control_cpu_ci']}")
        print(f"         request {r['request_ms']:.3f} ms (cpu {r['request_cpu_ms']:.3f}); the step alone p50 "
              f"{r['step_ms']:.3f} ms, p90 {r['step_p90_ms']:.3f} ms; repairs {r['repairs']}")
    print(f"  first  the step alone p50 {rows['first']['step_ms']:.3f} ms (previous request unseen: all planned)")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=150, help="turns timed per client")
    ap.add_argument("--corpus", default="/tmp/agent-corpus.json")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
