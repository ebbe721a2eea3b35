#!/usr/bin/env python3
"""Does conversation-affine routing keep agent conversations on their prefix cache? Figures on the emulator.

    .venv/bin/python bench/affinity.py               # ~1-2 minutes on a 2-core machine
    .venv/bin/python bench/affinity.py --json out.json

A lane of 3 emulator replicas, each with a limited prefix-cache pool (`cache_blocks`), serves 12
concurrent simulated agent conversations: append-only turns over the coding-agent corpus of
../shared/tools/make_agent_corpus.py (one seed per conversation, shortened with --messages and
--approx-tokens; turn k sends the messages before the k-th assistant message). The same workload
runs through the real gateway (uvicorn, Redis state) with:

  round_robin             every turn starts at the next replica
  conversation_affinity   turns stay on their conversation's home replica
  affinity, 2 gateways    two gateway processes on one Redis; each conversation alternates between them
  single replica          one replica whose pool is the three pools combined (the target's baseline)

and reports, from the usage the engine returned: cache-hit ratio by tokens (sum cached / sum
prompt), prefill tokens the replicas computed (sum prompt - cached; the emulators' own counters
agree), p50/p90 time to first token (the emulator's TTFT includes uncached tokens / prefill_tps),
and the routing decisions the gateway made (X-Gateway-Route). Target: affinity reaches at least
0.9 of the single replica's hit ratio.

Pools are sized from the workload: each replica holds `--headroom` x (conversations / replicas) x
the mean final conversation size; the single replica holds three times that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from gateway.emulator.tokens import simple_tokenize_prompt  # noqa: E402
from tests.support.emulator_proc import run_emulator  # noqa: E402
from tests.support.gateway_proc import run_gateway  # noqa: E402

CORPUS_TOOL = REPO.parent / "shared" / "tools" / "make_agent_corpus.py"
BLOCK = 16


# -- the workload ------------------------------------------------------------------------------------

def corpus(seed: int, messages: int, approx_tokens: int, cache_dir: Path) -> dict[str, Any]:
    path = cache_dir / f"agent-s{seed}-m{messages}-t{approx_tokens}.json"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        subprocess.run([sys.executable, str(CORPUS_TOOL), "--messages", str(messages), "--approx-tokens",
                        str(approx_tokens), "--seed", str(seed), "-o", str(tmp)], check=True,
                       stdout=subprocess.DEVNULL)
        os.replace(tmp, path)
    return json.loads(path.read_text())


def turns_of(body: dict[str, Any], max_turns: int) -> list[dict[str, Any]]:
    """Turn k of an append-only client: the messages before the k-th assistant message."""
    msgs = body["messages"]
    cuts = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"][:max_turns]
    base = {k: v for k, v in body.items() if k not in ("messages", "stream", "model")}
    return [{**base, "messages": msgs[:i]} for i in cuts]


class Workload:
    def __init__(self, args: argparse.Namespace) -> None:
        cache_dir = Path(args.corpus_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        seeds = [args.seed + i for i in range(args.conversations)]
        with ThreadPoolExecutor(4) as pool:
            bodies = list(pool.map(lambda s: corpus(s, args.messages, args.approx_tokens, cache_dir), seeds))
        self.conversations = [turns_of(b, args.turns) for b in bodies]
        # Tokens as the emulator counts them (simple tokenizer): the final turn of each conversation.
        self.final_tokens = [len(simple_tokenize_prompt(turns[-1])) for turns in self.conversations]
        self.turns = sum(len(t) for t in self.conversations)
        sizes = [[len(simple_tokenize_prompt(t)) for t in turns] for turns in self.conversations]
        self.prompt_tokens = sum(map(sum, sizes))
        # An unbounded pool: every turn hits the whole previous turn (block-aligned, the last token recomputed).
        ideal = sum(min(a, b - 1) // BLOCK * BLOCK for s in sizes for a, b in zip(s, s[1:]))
        self.ideal_hit_ratio = ideal / self.prompt_tokens


# -- one run -----------------------------------------------------------------------------------------

async def one_turn(session: aiohttp.ClientSession, url: str, cid: str, body: dict[str, Any],
                   max_tokens: int) -> dict[str, Any]:
    payload = {**body, "model": "agent", "stream": True, "max_tokens": max_tokens,
               "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    usage = None
    async with session.post(url + "/v1/chat/completions", data=orjson.dumps(payload),
                            headers={"Content-Type": "application/json", "X-Conversation-Id": cid}) as resp:
        route = resp.headers.get("X-Gateway-Route", "")
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        buf = b""
        async for data in resp.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                chunk = orjson.loads(event[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if ttft is None and (delta.get("content") or delta.get("reasoning")
                                         or delta.get("reasoning_content")):
                        ttft = time.perf_counter() - t0
    if usage is None:
        raise RuntimeError("no usage in the stream")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"prompt": usage["prompt_tokens"], "cached": cached, "ttft": ttft if ttft is not None else float("nan"),
            "reason": route.split(";")[0] if route else "", "replica": _replica(route)}


def _replica(route: str) -> str:
    for part in route.split(";"):
        part = part.strip()
        if part.startswith("replica="):
            return part[8:]
    return ""


async def drive(urls: list[str], work: Workload, max_tokens: int, tag: str) -> tuple[list[dict[str, Any]], float]:
    """Every conversation's turns in order, all conversations at once; turn k goes to urls[k % len(urls)]."""
    results: list[dict[str, Any]] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)

    async def agent(i: int, turns: list[dict[str, Any]]) -> None:
        cid = f"{tag}-agent-{i}"
        for k, body in enumerate(turns):
            r = await one_turn(session, urls[k % len(urls)], cid, body, max_tokens)
            r["conversation"], r["turn"] = i, k
            results.append(r)

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(agent(i, t) for i, t in enumerate(work.conversations)))
    return results, time.perf_counter() - t0


def summarise(name: str, results: list[dict[str, Any]], wall: float, emus: list) -> dict[str, Any]:
    prompt = sum(r["prompt"] for r in results)
    cached = sum(r["cached"] for r in results)
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] == r["ttft"])
    stats = [e.stats() for e in emus]
    # Replicas per conversation: how often a conversation's turns changed replica.
    moves = 0
    by_conv: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        by_conv.setdefault(r["conversation"], []).append(r)
    for turns in by_conv.values():
        turns.sort(key=lambda r: r["turn"])
        moves += sum(1 for a, b in zip(turns, turns[1:]) if a["replica"] != b["replica"])
    return {
        "run": name,
        "requests": len(results),
        "hit_ratio": cached / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": prompt - cached,
        "engine_prefill_tokens": sum(s["prompt_tokens"] - s["cached_tokens"] for s in stats),
        "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_p90_ms": 1000 * ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else float("nan"),
        "wall_s": wall,
        "replica_moves": moves,
        "reasons": dict(Counter(r["reason"] for r in results)),
        "requests_per_replica": [s["requests"] for s in stats],
    }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def redis_flush(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


def routes(replicas: list[str], policy: str) -> dict[str, Any]:
    lane = {"engine": "vllm", "replicas": replicas, "upstream_model": "deepseek-v4-flash",
            "qualification": "not_required", "cache": {"block_size": BLOCK}, "routing": policy,
            "render": {"template": os.environ.get("BENCH_TEMPLATE", "deepseek_v4.1") or None}}
    return {"lanes": {"agents": lane}, "models": {"agent": "agents"}}


def run(name: str, emus: list, policy: str, gateways: int, work: Workload, args: argparse.Namespace) -> dict[str, Any]:
    for e in emus:
        e.reset()
    redis_flush(args.redis)
    env = {"GATEWAY_REDIS_URL": args.redis}
    cfg = routes([e.url for e in emus], policy)
    with contextlib.ExitStack() as stack:
        gws = [stack.enter_context(run_gateway(cfg, env=env)) for _ in range(gateways)]
        procs = [g.proc.pid for g in gws] + [e.proc.pid for e in emus]
        before = [cpu_s(pid) for pid in procs]
        results, wall = asyncio.run(drive([g.url for g in gws], work, args.max_tokens, name.replace(" ", "_")))
        used = [cpu_s(pid) - b for pid, b in zip(procs, before)]
        summary = summarise(name, results, wall, emus)
        summary["gateway_cpu_s"] = round(sum(used[:gateways]), 2)
        summary["emulator_cpu_s"] = round(sum(used[gateways:]), 2)
    print(_row(summary), flush=True)
    return summary


# -- output ------------------------------------------------------------------------------------------

HEADER = (f"{'run':<28} {'hit ratio':>9} {'prefill tok':>11} {'p50 TTFT':>9} {'p90 TTFT':>9} {'wall':>6} "
          f"{'moves':>5} {'gw cpu':>6} {'emu cpu':>7}  routing decisions")


def _row(s: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["reasons"].items(), key=lambda kv: -kv[1]))
    return (f"{s['run']:<28} {s['hit_ratio']:>9.3f} {s['prefill_tokens']:>11,} {s['ttft_p50_ms']:>7.0f}ms "
            f"{s['ttft_p90_ms']:>7.0f}ms {s['wall_s']:>5.1f}s {s['replica_moves']:>5} {s['gateway_cpu_s']:>5.1f}s "
            f"{s['emulator_cpu_s']:>6.1f}s  {reasons}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--messages", type=int, default=64, help="corpus messages per conversation")
    p.add_argument("--approx-tokens", type=int, default=16000, help="corpus size per conversation")
    p.add_argument("--turns", type=int, default=24, help="turns per conversation (at most)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--headroom", type=float, default=1.0,
                   help="pool per replica = headroom x conversations/replicas x mean final conversation tokens")
    p.add_argument("--prefill-tps", type=float, default=10000.0, help="emulator: uncached tokens per second")
    p.add_argument("--ttft-ms", type=float, default=5.0)
    p.add_argument("--decode-tps", type=float, default=2000.0)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--tokenizer", choices=["simple"], default="simple",
                   help="emulator tokenizer (simple: one token per word; cheap on 2 cores)")
    p.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    p.add_argument("--corpus-dir", default=str(Path(tempfile.gettempdir()) / "affinity-bench-corpus"))
    p.add_argument("--skip", action="append", default=[], help="skip a run: rr, affinity, two, single")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()

    t0 = time.perf_counter()
    work = Workload(args)
    mean_final = statistics.mean(work.final_tokens)
    per_replica = args.conversations / args.replicas
    pool = math.ceil(args.headroom * per_replica * mean_final / BLOCK)
    print(f"workload: {args.conversations} conversations, {work.turns} turns, {work.prompt_tokens:,} prompt tokens "
          f"(final conversation {min(work.final_tokens):,}-{max(work.final_tokens):,} tokens, mean {mean_final:,.0f}); "
          f"hit ratio with unbounded pools: {work.ideal_hit_ratio:.3f}")
    print(f"pools: {args.replicas} replicas x {pool:,} blocks of {BLOCK} tokens "
          f"(= {args.headroom:g} x {per_replica:g} conversations); single replica {args.replicas * pool:,} blocks; "
          f"prefill {args.prefill_tps:,.0f} tok/s, ttft {args.ttft_ms:g} ms")
    knobs = dict(flavour="vllm", block_size=BLOCK, tokenizer=args.tokenizer, prefill_tps=args.prefill_tps,
                 ttft_ms=args.ttft_ms, decode_tps=args.decode_tps, recent_requests=4)
    summaries = []
    print(HEADER, flush=True)
    with contextlib.ExitStack() as stack:
        emus = [stack.enter_context(run_emulator(cache_blocks=pool, **knobs)) for _ in range(args.replicas)]
        if "rr" not in args.skip:
            summaries.append(run("round_robin", emus, "round_robin", 1, work, args))
        if "affinity" not in args.skip:
            summaries.append(run("conversation_affinity", emus, "conversation_affinity", 1, work, args))
        if "two" not in args.skip:
            summaries.append(run("affinity, 2 gateways", emus, "conversation_affinity", 2, work, args))
        if "single" not in args.skip:
            with run_emulator(cache_blocks=pool * args.replicas, **knobs) as big:
                summaries.append(run("single replica (3x pool)", [big], "conversation_affinity", 1, work, args))
    by = {s["run"]: s for s in summaries}
    single = by.get("single replica (3x pool)")
    if single:
        print()
        for s in summaries:
            if s is not single:
                print(f"{s['run']:<28} hit ratio = {s['hit_ratio'] / single['hit_ratio']:.3f} x single replica")
        for name in ("conversation_affinity", "affinity, 2 gateways"):
            if name in by:
                ok = by[name]["hit_ratio"] >= 0.9 * single["hit_ratio"]
                print(f"target {name}: >= 0.9 x single replica: {'met' if ok else 'NOT met'}")
    print(f"\nbench took {time.perf_counter() - t0:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "final_tokens": work.final_tokens,
                                               "ideal_hit_ratio": work.ideal_hit_ratio,
                                               "pool_blocks": pool, "runs": summaries}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
