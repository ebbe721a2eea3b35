"""A fleet of paced agent sessions through one gateway: how many can one process serve?

    .venv/bin/python bench/fleet.py [--sessions 40] [--seconds 120] [--workers 1|2] [--modes direct,router,gateway]

N concurrent agent sessions run against an emulated lane paced like a real engine (decode and prefill
rates of the demo), for a bounded time, first straight to the emulator ("direct"), then through
vllm-router ("router": Rust, no analysis, the proxying share's reference, when ../shared/perf/setup.sh
installed it), then through one gateway process (or `--workers 2`, which shares state through a
private Redis). Sessions have the
shape of real agents: a shared system prompt and tools (`--head-tokens`), a first user turn, then tool
calls whose results grow the history each turn (`--growth-tokens`), a think time between turns, every
request streamed with usage. Printed, per mode: sessions and turns served, TTFT p50/p99 (and what the
gateway adds to direct), the gateway's CPU per turn (its whole process tree, from /proc), the share of
turns with a cache verdict and with predicted == reported cached tokens, conversations formed, the
stored state per conversation, and RSS over the run (flat after warm-up is the goal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.routes import lane  # noqa: E402
from tests.support.emulator_proc import run_emulator  # noqa: E402
from tests.support.gateway_proc import run_gateway  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
WORDS = ["alpha", "beta", "gamma", "delta", "file", "src", "test", "def", "return", "import", "class", "value"]
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} " + "detail " * 60,
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}, "command": {"type": "string"}}}}}
         for name in ("read_file", "write_file", "run_shell", "search", "list_dir", "apply_patch")]


def words(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, tokens)))  # ~1 token per word


# -- the gateway's process tree, read from /proc ---------------------------------------------------------


def tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_s(pid: int) -> float:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICKS


def rss_mb(pid: int) -> float:
    kb = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kb += int(line.split()[1])
    return kb / 1024


# -- one agent session -----------------------------------------------------------------------------------


@dataclass
class Stats:
    turns: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    by_turn: dict[tuple[int, int], float] = field(default_factory=dict)  # (session, turn) -> TTFT
    sessions_served: int = 0  # sessions with at least one turn answered (ended ones included)
    keys: list[str] = field(default_factory=list)  # each session's conversation, as the gateway named it
    prompt_tokens: list[int] = field(default_factory=list)  # each session's last prompt


async def session(i: int, client: httpx.AsyncClient, head: str, args: argparse.Namespace, deadline: float,
                  stats: Stats) -> None:
    rng = random.Random(i)
    await asyncio.sleep(rng.uniform(0, args.think_s))  # arrivals spread over one think time
    generation = 0  # a session whose prompt reached --max-prompt-tokens ends; a new one takes its place

    def fresh() -> list[dict[str, Any]]:
        return [{"role": "system", "content": head},
                {"role": "user", "content": f"Task {i}.{generation}: " + words(rng, 200)}]

    messages = fresh()
    turn = last_prompt = 0
    conversation = None
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        first = None
        usage = None
        text: list[str] = []
        calls_by_index: dict[int, dict[str, Any]] = {}
        try:
            async with client.stream("POST", "/v1/chat/completions", json={
                    "model": "ds", "messages": messages, "tools": TOOLS, "stream": True,
                    "stream_options": {"include_usage": True}, "max_tokens": args.answer_tokens}) as resp:
                if resp.status_code != 200:
                    stats.errors += 1
                    await resp.aread()
                    await asyncio.sleep(args.think_s)
                    continue
                conversation = (resp.headers.get("x-gateway-conversation") or "").split(";")[0] or conversation
                async for line in resp.aiter_lines():
                    if not line.startswith("data:") or line.endswith("[DONE]"):
                        continue
                    chunk = orjson.loads(line[5:])
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        if first is None and (delta.get("content") or delta.get("reasoning_content")
                                              or delta.get("reasoning")):
                            first = time.perf_counter() - t0
                        if delta.get("content"):
                            text.append(delta["content"])
                        for tc in delta.get("tool_calls") or ():
                            c = calls_by_index.setdefault(tc.get("index", 0), {
                                "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                            c["id"] = tc.get("id") or c["id"]
                            fn = tc.get("function") or {}
                            c["function"]["name"] += fn.get("name") or ""
                            c["function"]["arguments"] += fn.get("arguments") or ""
                    usage = chunk.get("usage") or usage
        except httpx.HTTPError:
            stats.errors += 1
            await asyncio.sleep(args.think_s)
            continue
        stats.turns += 1
        if first is not None:
            stats.ttft.append(first)
            stats.by_turn[(i, turn)] = first
        turn += 1
        last_prompt = (usage or {}).get("prompt_tokens")
        # The answer goes back as it came (an append-only client), then the next observation: a tool
        # result when the model called a tool, else the user's next message.
        calls = [c for c in calls_by_index.values() if c["function"]["name"]]
        said: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            said["tool_calls"] = calls
        messages.append(said)
        observation = words(rng, args.growth_tokens)
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": observation} for c in calls[:1]] or \
            [{"role": "user", "content": observation}]
        await asyncio.sleep(args.think_s * rng.uniform(0.5, 1.5))
        if (last_prompt or 0) >= args.max_prompt_tokens:
            stats.prompt_tokens.append(last_prompt or 0)
            stats.sessions_served += 1
            if conversation:
                stats.keys.append(conversation)
            generation += 1
            messages, turn, conversation = fresh(), 0, None
    if turn:
        stats.prompt_tokens.append(last_prompt or 0)
        stats.sessions_served += 1
    if conversation:
        stats.keys.append(conversation)


async def drive(url: str, args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    rng = random.Random(7)
    head = "You are a coding agent in a large repository. " + words(rng, args.head_tokens)
    stats = Stats()
    limits = httpx.Limits(max_connections=args.sessions + 8, max_keepalive_connections=args.sessions + 8)
    rss: list[tuple[float, float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.monotonic()
        deadline = t0 + args.seconds
        cpu0 = cpu_s(pid) if pid else 0.0

        async def sample() -> None:
            while time.monotonic() < deadline:
                if pid:
                    rss.append((time.monotonic() - t0, rss_mb(pid)))
                await asyncio.sleep(args.seconds / 12)

        sampler = asyncio.create_task(sample())
        await asyncio.gather(*(session(i, client, head, args, deadline, stats) for i in range(args.sessions)))
        sampler.cancel()
        cpu = (cpu_s(pid) - cpu0) if pid else 0.0
    ttft = sorted(stats.ttft)
    return {"turns": stats.turns, "errors": stats.errors, "sessions": stats.sessions_served, "keys": stats.keys,
            "by_turn": stats.by_turn,
            "prompt_tokens": statistics.mean(stats.prompt_tokens) if stats.prompt_tokens else 0,
            "ttft_p50": statistics.median(ttft) if ttft else None,
            "ttft_p99": ttft[min(len(ttft) - 1, int(len(ttft) * 0.99))] if ttft else None,
            "cpu_ms_per_turn": 1000 * cpu / stats.turns if pid and stats.turns else None, "rss": rss}


def state_bytes(url: str, keys: list[str]) -> float | None:
    """The mean size of a conversation's stored state (the admin API's timeline), over up to 20 sessions."""
    sizes = []
    for key in keys[:20]:
        r = httpx.get(url + "/admin/api/conversations/" + key, timeout=30)
        state = r.json().get("state") if r.status_code == 200 else None
        if state and state.get("state_bytes"):
            sizes.append(state["state_bytes"])
    return statistics.mean(sizes) if sizes else None


def verdicts(url: str, turns: int) -> dict[str, Any]:
    rows = httpx.get(url + "/admin/api/records", params={"limit": 100_000}, timeout=60).json()["records"]
    rows = [r for r in rows if r.get("status") == 200]
    judged = [r for r in rows if r.get("verdict") not in (None, "unknown")]
    exact = [r for r in judged if r.get("cached_tokens") is not None
             and r.get("predicted_cached_tokens") == r.get("cached_tokens")]
    return {"records": len(rows), "judged": len(judged), "exact": len(exact),
            "conversations": len({r.get("conversation") for r in rows if r.get("conversation")})}


@contextlib.contextmanager
def private_redis(workers: int) -> Iterator[dict[str, str]]:
    if workers == 1:
        yield {}
        return
    from tests.support.redis_proc import run_redis

    with run_redis() as port:
        yield {"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{port}/0"}


ROUTER = Path(os.environ.get("PERF_WORK", Path.home() / ".cache" / "gateway-perf")) / ".venv-vllmrouter" / "bin" / \
    "vllm-router"


@contextlib.contextmanager
def run_router(upstream: str) -> Iterator[tuple[str, int]]:
    """vllm-router (Rust, no analysis) in front of the emulator: the proxying share's reference."""
    from tests.support.gateway_proc import free_port, wait_http

    port = free_port()
    proc = subprocess.Popen([str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", upstream,
                             "--policy", "round_robin", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 60)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--modes", default="direct,router,gateway", help="router: vllm-router, when installed "
                    "(../shared/perf/setup.sh)")
    ap.add_argument("--head-tokens", type=int, default=15_000, help="shared system prompt (tools add ~2K)")
    ap.add_argument("--growth-tokens", type=int, default=2_000, help="tool result per turn")
    ap.add_argument("--max-prompt-tokens", type=int, default=200_000,
                    help="a session whose prompt reaches this ends; a new session takes its place")
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--think-s", type=float, default=3.0)
    ap.add_argument("--decode-tps", type=float, default=60.0)
    ap.add_argument("--prefill-tps", type=float, default=5_000.0)
    args = ap.parse_args()
    knobs = dict(flavour="vllm", tokenizer="dsv41", block_size=16, decode_tps=args.decode_tps,
                 prefill_tps=args.prefill_tps, output_tokens=args.answer_tokens, reasoning_tokens=0,
                 max_model_len=1 << 20)
    results: dict[str, dict[str, Any]] = {}
    print(f"{args.sessions} sessions x {args.seconds:g} s, head {args.head_tokens} tokens, +{args.growth_tokens} "
          f"per turn up to {args.max_prompt_tokens}, think {args.think_s:g} s, decode {args.decode_tps:g} tok/s, "
          f"prefill {args.prefill_tps:g} tok/s, gateway workers {args.workers}")
    for mode in args.modes.split(","):
        if mode == "router" and not ROUTER.exists():
            print(f"router   skipped: {ROUTER} is not installed (../shared/perf/setup.sh)")
            continue
        with run_emulator(**knobs) as emu:
            if mode == "direct":
                results[mode] = asyncio.run(drive(emu.url, args, None))
            elif mode == "router":
                with run_router(emu.url) as (url, pid):
                    results[mode] = asyncio.run(drive(url, args, pid))
            else:
                with private_redis(args.workers) as env, \
                        run_gateway({"lanes": {"ds": lane(emu.url, render={"template": "deepseek_v4.1",
                                                                           "thinking": False},
                                                          cache={"block_size": knobs["block_size"]})},
                                     "models": {"ds": "ds"}}, workers=args.workers, env=env) as gw:
                    results[mode] = asyncio.run(drive(gw.url, args, gw.proc.pid))
                    time.sleep(2)  # the last turns' analysis
                    results[mode].update(verdicts(gw.url, results[mode]["turns"]))
                    results[mode]["state_bytes"] = state_bytes(gw.url, results[mode]["keys"])
        r = results[mode]
        line = (f"{mode:8s} sessions served {r['sessions']} turns {r['turns']:5d} errors {r['errors']} "
                f"TTFT p50 {1000 * (r['ttft_p50'] or 0):.0f} ms p99 {1000 * (r['ttft_p99'] or 0):.0f} ms, "
                f"a session's last prompt {r['prompt_tokens'] / 1000:.0f}K tokens on average")
        if r.get("cpu_ms_per_turn") is not None:
            line += f" | CPU {r['cpu_ms_per_turn']:.2f} ms/turn"
        if "judged" in r:
            line += (f" | verdicts {r['judged']}/{r['records']}, predicted == reported {r['exact']}/{r['judged']}, "
                     f"{r['conversations']} conversations")
        if r.get("state_bytes"):
            line += f" | stored state {r['state_bytes'] / 1024:.0f} KB per conversation"
        print(line)
        if r["rss"]:
            print("         RSS MB over time: " + " ".join(f"{t:.0f}s:{m:.0f}" for t, m in r["rss"]))
    d = results.get("direct")
    for mode in ("router", "gateway"):
        g = results.get(mode)
        if d and g and d["ttft_p50"] and g["ttft_p50"]:
            # The sessions are the same in every mode (seeded): a turn's TTFT against the same turn's direct.
            added = sorted(g["by_turn"][k] - d["by_turn"][k] for k in g["by_turn"].keys() & d["by_turn"].keys())
            print(f"TTFT added by {mode}, turn by turn against direct ({len(added)} turns): "
                  f"p50 {1000 * added[len(added) // 2]:+.1f} ms, p90 {1000 * added[int(len(added) * 0.9)]:+.1f} ms, "
                  f"p99 {1000 * added[min(len(added) - 1, int(len(added) * 0.99))]:+.1f} ms")
    g = results.get("gateway")
    if g and len(g["rss"]) >= 4 and g.get("conversations"):
        warm = g["rss"][len(g["rss"]) // 3][1]
        print(f"gateway RSS after warm-up {warm:.0f} MB -> end {g['rss'][-1][1]:.0f} MB "
              f"({(g['rss'][-1][1] - g['rss'][0][1]) / g['conversations']:.2f} MB per conversation over the run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
