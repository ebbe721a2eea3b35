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


async def measure(policy: HealPolicy, lane_rt, prev: bytes, cur: bytes, cid: str, rounds: int,
                  warm: bool) -> tuple[list[float], int]:
    times, healed = [], 0
    for i in range(rounds):
        key = f"{cid}-{i}" if not warm else cid
        if warm:  # the previous turn, as the gateway saw it (not timed)
            body = orjson.loads(prev)
            await policy.apply(exchange(body, key), lane_rt, body)
        body = orjson.loads(cur)
        ex = exchange(body, key)
        # Start on a fresh scheduler slice, as a request does after awaiting its body: on a loaded
        # machine a step timed right after 20 ms of parsing is often preempted midway.
        await asyncio.sleep(0.002)
        t0 = time.perf_counter()
        await policy.apply(ex, lane_rt, body)
        times.append((time.perf_counter() - t0) * 1000)
        healed = sum(len(h.indices) for h in ex.healed)
    return times, healed


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def main_async(args: argparse.Namespace) -> None:
    body = corpus(Path(args.corpus))
    store = MemoryStore()
    book = RelayedBook(store, 3600)
    for m in body["messages"]:  # every assistant message of the session, as the gateway relayed it
        if m["role"] == "assistant":
            book.remember("default", heal_digest(m), Relayed.from_message(m))
    await asyncio.sleep(0)
    policy = HealPolicy(book)
    settle()  # the gateway's own collector settings (gc_tuning.py), as in a serving process
    bad = drifted(body)
    # The previous turn: the same session without its last assistant message and tool result.
    prev_bad = dict(bad, messages=bad["messages"][:-2])
    prev_clean = dict(body, messages=body["messages"][:-2])
    enc = orjson.dumps
    rows = []
    for name, lane_rt, prev, cur, warm in (
        ("heals", lane(KINDS), enc(prev_bad), enc(bad), True),
        ("clean", lane(KINDS), enc(prev_clean), enc(body), True),
        ("first", lane(KINDS), b"", enc(bad), False),
        ("off", lane([]), enc(prev_bad), enc(bad), True),
    ):
        rounds = args.rounds if name != "first" else max(10, args.rounds // 10)
        times, healed = await measure(policy, lane_rt, prev, cur, name, rounds, warm)
        rows.append({"case": name, "min_ms": round(min(times), 3), "p50_ms": round(statistics.median(times), 3),
                     "p90_ms": round(pct(times, 0.9), 3),
                     "repairs": healed, "rounds": rounds})
    n = len(body["messages"])
    print(f"heal step on the corpus body: {n} messages, {sum(m['role'] == 'assistant' for m in body['messages'])} "
          f"assistant, {len(enc(body)) / 1e6:.2f} MB")
    for r in rows:
        print(f"  {r['case']:6} min {r['min_ms']:7.3f} ms  p50 {r['p50_ms']:7.3f} ms  p90 {r['p90_ms']:7.3f} ms  "
              f"repairs {r['repairs']}")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: p50 and p90 include waiting for a core)")
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--corpus", default="/tmp/agent-corpus.json")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
