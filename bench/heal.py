#!/usr/bin/env python3
"""Drift healing's cost on the hot path, for the ~1,600-message corpus body (784 assistant messages).

The heal step (gateway/heal/policy.py) is timed in process on the body as the pipeline hands it over
(parsed), the previous turn already seen, for:

  heals     an agent that sorts every call's argument keys and strips every reasoning: each of the
            784 assistant messages gets two repairs, every turn;
  clean     the same session sent back exactly as relayed: nothing to repair;
  first     heals, but the conversation's previous request unseen by this process (a restart, another
            gateway process): every message looked up and planned;
  off       a lane without `heal` (the control).

    python bench/heal.py [--rounds 200]
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

from gateway.config import Lane  # noqa: E402
from gateway.conversations.effort import EffortChoice  # noqa: E402
from gateway.conversations.identity import lineage  # noqa: E402
from gateway.conversations.policy import Found  # noqa: E402
from gateway.conversations.state import ConversationState  # noqa: E402
from gateway.exchange import Exchange  # noqa: E402
from gateway.gc_tuning import settle  # noqa: E402
from gateway.heal.base import Relayed, heal_digest  # noqa: E402
from gateway.heal.book import RelayedBook  # noqa: E402
from gateway.heal.policy import HealPolicy  # noqa: E402
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


async def request(policy: HealPolicy, lane_rt, raw: bytes, cid: str) -> tuple[float, float, float, int]:
    """One request's in-process hot path around the heal step, as the pipeline runs it: the body parsed,
    the policy, the body serialised for upstream, the body freed (and what the step deferred run).
    Returns (wall ms, CPU ms, the step's own wall ms, repairs)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    body = orjson.loads(raw)
    ex = exchange(body, cid)
    s0 = time.perf_counter()
    await policy.apply(ex, lane_rt, body)
    s1 = time.perf_counter()
    out = orjson.dumps(body)
    repairs = sum(len(h.indices) for h in ex.healed)
    del body, ex, out
    await asyncio.sleep(0)  # the step's deferred frees (call_soon) run here
    return (time.perf_counter() - w0) * 1000, (time.thread_time() - c0) * 1000, (s1 - s0) * 1000, repairs


async def paired(policy: HealPolicy, on, off, prev: bytes, cur: bytes, cid: str, rounds: int) -> dict:
    """Rounds of three requests on the same body: heal on, heal off, heal off again (the control: how
    far apart two identical requests measure), in an order that rotates every round."""
    on_w, off_w, ctl_w, on_c, off_c, ctl_c, step, repairs = [], [], [], [], [], [], [], 0
    for i in range(rounds):
        body = orjson.loads(prev)  # the previous turn, as the gateway saw it (not timed)
        await policy.apply(exchange(body, cid), on, body)
        del body
        await asyncio.sleep(0.002)  # a fresh scheduler slice for each round
        results = {}
        for which in ("on", "off", "ctl")[i % 3:] + ("on", "off", "ctl")[:i % 3]:
            results[which] = await request(policy, on if which == "on" else off, cur, cid)
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
            "step_ms": med(step), "step_p90_ms": round(pct(step, 0.9), 3), "repairs": repairs, "rounds": rounds}


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
    # The previous turn: the same session without its last assistant message and tool result.
    rows = {
        "heals": await paired(policy, on, off, enc(dict(bad, messages=bad["messages"][:-2])), enc(bad), "heals",
                              args.rounds),
        "clean": await paired(policy, on, off, enc(dict(body, messages=body["messages"][:-2])), enc(body), "clean",
                              args.rounds),
        "first": await first(policy, on, enc(bad), max(10, args.rounds // 10)),
    }
    n = len(body["messages"])
    print(f"heal on the corpus body: {n} messages, {sum(m['role'] == 'assistant' for m in body['messages'])} "
          f"assistant, {len(enc(body)) / 1e6:.2f} MB; {args.rounds} rounds of paired requests (parse, policy, "
          f"serialise, free)")
    print("  added = median over rounds of (heal on - heal off) on the same body; control = (heal off - heal off),")
    print("  how far apart two identical requests measure; [95% interval of the median]")
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
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--corpus", default="/tmp/agent-corpus.json")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
