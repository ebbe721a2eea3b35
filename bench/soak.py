"""Soak: minutes of mixed traffic through the real gateway to emulated engines with injected faults.

    python bench/soak.py                  # 5 minutes, concurrency 64
    python bench/soak.py --minutes 2      # shorter
    python bench/soak.py --seconds 30     # a smoke run

What runs: two emulator replicas behind the main lane, each failing 5% of requests with a 500
(`fail_rate`), and a third emulator behind a "dying" lane that cuts every stream after a few chunks
(`die_after_chunks`), which a small share of the streaming requests is sent to. Every request
carries a client key (the key check is on the path). Requests are half streaming, half not, with
a few hundred distinct conversations, so the conversation state reaches a steady size.

What it prints: requests, errors by kind (only the injected ones may fail, and they must fail
cleanly: a 502 (the engine's 500) in OpenAI's error shape, or an error event then [DONE]), p50/p99 latency, and the
gateway's RSS at start, after warm-up and at the end. Exit status 1 when an uninjected error
happened or RSS grew by 10% or more after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from tests.support.emulator_proc import run_emulator  # noqa: E402
from tests.support.gateway_proc import run_gateway  # noqa: E402

KEY = "sk-soak-" + os.urandom(8).hex()
ADMIN = "soak-admin-" + os.urandom(12).hex()


def family(pid: int) -> list[int]:
    """The gateway process and its children (the analysis worker, multiprocessing's resource tracker)."""
    pids = [pid]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(proc.name))
            except (OSError, IndexError, ValueError):
                pass
    return pids


def _status(pid: int, names: tuple[str, ...]) -> dict[str, float]:
    """MiB per /proc status field, summed over the gateway's process family."""
    out = dict.fromkeys(names, 0.0)
    for member in family(pid):
        try:
            lines = Path(f"/proc/{member}/status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, value = line.partition(":")
            if name in out:
                out[name] += int(value.split()[0]) / 1024
    return out


def cpu_s(pid: int) -> dict[int, tuple[float, int]]:
    """CPU seconds (user + system) and niceness of each process of the gateway's family."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for member in family(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[member] = ((int(fields[11]) + int(fields[12])) / tick, int(fields[16]))
    return out


def rss_mib(pid: int) -> float:
    return _status(pid, ("VmRSS",))["VmRSS"]


def rss_parts(pid: int) -> str:
    """Heap (anonymous) versus mapped files and shared memory, in MiB."""
    parts = _status(pid, ("RssAnon", "RssFile", "RssShmem"))
    return " ".join(f"{k[3:].lower()} {v:.1f}" for k, v in parts.items())


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


class Tally:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.latency: dict[str, list[float]] = {"stream": [], "whole": []}
        self.ttfb: list[float] = []
        self.done = 0

    def add(self, kind: str, detail: str = "") -> None:
        self.kinds[kind] += 1
        self.done += 1
        if detail and kind not in self.examples:
            self.examples[kind] = detail[:300]


def classify_error_body(status: int, text: str, dying: bool) -> tuple[str, str]:
    try:
        err = json.loads(text)["error"]
        shaped = set(err) == {"message", "type", "param", "code"}
    except (ValueError, KeyError, TypeError):
        return f"unexpected: HTTP {status}, not OpenAI-shaped", text
    if status == 502 and "Emulated engine failure" in str(err.get("message")) and shaped:
        return "injected: engine 500 (fail_rate)", ""
    if dying and status == 502 and err.get("code") == "upstream_error" and shaped:
        return "injected: engine died before its first event reached the gateway", ""
    lane = "dying" if dying else "main"
    return f"unexpected: HTTP {status} {err.get('code')} on the {lane} lane", text


class Conversations:
    """Agent sessions: each request continues one (its history, the answer it got, a new instruction)."""

    def __init__(self, n: int, max_turns: int, keyed: bool) -> None:
        self.history: list[list[dict]] = [[] for _ in range(n)]
        self.generation = [0] * n
        self.max_turns = max_turns
        self.keyed = keyed
        self.idle = list(range(n))  # an agent waits for its answer before its next turn

    def take(self, rng: random.Random) -> int:
        i = rng.randrange(len(self.idle))
        self.idle[i], self.idle[-1] = self.idle[-1], self.idle[i]
        return self.idle.pop()

    def give_back(self, k: int) -> None:
        self.idle.append(k)

    def request(self, k: int) -> tuple[list[dict], int]:
        hist = self.history[k]
        if len(hist) >= 2 * self.max_turns:  # the agent's task is done: a fresh session takes its place
            hist.clear()
            self.generation[k] += 1
        gen = self.generation[k]
        msgs = [{"role": "system", "content": f"You are agent {k}.{gen}, a careful assistant."}] + hist
        msgs.append({"role": "user", "content": f"Step {len(hist) // 2 + 1} of task {k}.{gen}: continue."})
        return msgs, gen

    def answered(self, k: int, gen: int, msgs: list[dict], answer: str) -> None:
        if self.generation[k] == gen and len(self.history[k]) == len(msgs) - 2:
            self.history[k] += [msgs[-1], {"role": "assistant", "content": answer}]


async def one(session: aiohttp.ClientSession, url: str, tally: Tally, rng: random.Random, args,
              convs: Conversations) -> None:
    stream = rng.random() < 0.5
    dying = stream and rng.random() < args.die_share
    k = convs.take(rng)
    try:
        await _turn(session, url, tally, rng, args, convs, k, stream, dying)
    finally:
        convs.give_back(k)


async def _turn(session, url, tally, rng, args, convs, k, stream, dying) -> None:
    msgs, gen = convs.request(k)
    body = {"model": "soak-die" if dying else "soak", "stream": stream, "max_tokens": rng.randint(8, 48),
            "messages": msgs}
    if convs.keyed:
        body["prompt_cache_key"] = f"soak-{k}.{gen}"
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                kind, detail = classify_error_body(resp.status, await resp.text(), dying)
                tally.add(kind, detail)
                return
            if not stream:
                data = await resp.json(content_type=None)
                if not data.get("choices"):
                    tally.add("unexpected: 200 without choices", json.dumps(data))
                    return
                convs.answered(k, gen, msgs, data["choices"][0]["message"].get("content") or "")
                tally.latency["whole"].append(time.perf_counter() - t0)
                tally.add("ok")
                return
            first = None
            events: list[bytes] = []
            buf = b""
            async for chunk in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter() - t0
                buf += chunk
                *lines, buf = buf.split(b"\n")
                events += [ln[5:].strip() for ln in lines if ln.startswith(b"data:")]
            if not events or events[-1] != b"[DONE]":
                tally.add("unexpected: stream without [DONE]", repr(events[-2:]))
                return
            errors = [json.loads(e)["error"] for e in events[:-1] if b'"error"' in e and "error" in json.loads(e)]
            if errors:
                code = errors[-1].get("code")
                if dying and code == "upstream_disconnected":
                    tally.add("injected: engine died mid-stream (die_after_chunks)")
                else:
                    tally.add(f"unexpected: error event {code} on {'dying' if dying else 'main'} lane",
                              json.dumps(errors[-1]))
                return
            if dying:
                tally.add("unexpected: a dying stream finished", "")
                return
            answer = "".join((c["choices"][0]["delta"].get("content") or "") for c in map(json.loads, events[:-1])
                             if c.get("choices"))
            convs.answered(k, gen, msgs, answer)
            tally.latency["stream"].append(time.perf_counter() - t0)
            if first is not None:
                tally.ttfb.append(first)
            tally.add("ok")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        tally.add(f"unexpected: client {type(exc).__name__}", str(exc))


async def drive(gw_url: str, pid: int, args) -> tuple[Tally, dict[str, float], list[tuple[float, float, int]]]:
    url = gw_url + "/v1/chat/completions"
    tally = Tally()
    rss = {"start": rss_mib(pid)}
    series: list[tuple[float, float, int]] = []
    duration = args.seconds if args.seconds else args.minutes * 60
    warmup = args.warmup_s if args.warmup_s is not None else min(60.0, max(10.0, duration * 0.2))
    t_start = time.monotonic()
    deadline = t_start + duration
    connector = aiohttp.TCPConnector(limit=args.concurrency, limit_per_host=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {"Authorization": f"Bearer {KEY}"}

    convs = Conversations(args.conversations, args.turns, not args.lineage)

    async def worker(n: int) -> None:
        rng = random.Random(n)
        while time.monotonic() < deadline:
            await one(session, url, tally, rng, args, convs)

    async def monitor() -> None:
        warmed = False
        next_sample = t_start
        while time.monotonic() < deadline:
            now = time.monotonic()
            if not warmed and now - t_start >= warmup:
                rss["after_warmup"] = rss_mib(pid)
                warmed = True
            if now >= next_sample:
                series.append((now - t_start, rss_mib(pid), tally.done))
                if args.verbose:
                    print(f"  t={now - t_start:6.0f}s rss={series[-1][1]:7.1f} MiB ({rss_parts(pid)}) "
                          f"requests={tally.done}", flush=True)
                next_sample += args.sample_s
            await asyncio.sleep(0.5)
        rss["end"] = rss_mib(pid)
        rss["end_parts"] = rss_parts(pid)  # type: ignore[assignment]

    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        await asyncio.gather(monitor(), *(worker(n) for n in range(args.concurrency)))
    rss.setdefault("after_warmup", rss["end"])
    rss["warmup_s"] = warmup
    rss["duration_s"] = time.monotonic() - t_start
    return tally, rss, series


def gateway_overview(url: str) -> dict:
    import urllib.request

    req = urllib.request.Request(url + "/admin/api/overview?probe=0", headers={"Authorization": f"Bearer {ADMIN}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
            return json.loads(resp.read())
    except OSError as exc:
        print(f"(admin overview unavailable: {exc})")
        return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=None, help="overrides --minutes")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--fail-rate", type=float, default=0.05, help="engine 500s on the main lane")
    p.add_argument("--die-share", type=float, default=0.03, help="share of streams sent to the dying lane")
    p.add_argument("--conversations", type=int, default=400, help="agent sessions running side by side")
    p.add_argument("--turns", type=int, default=12, help="turns per session before a fresh one replaces it")
    p.add_argument("--lineage", action="store_true", help="no prompt_cache_key: the gateway finds conversations "
                                                           "by lineage")
    p.add_argument("--decode-tps", type=float, default=400.0, help="the emulators' decode speed (tokens/s)")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="the emulators' time to first token")
    p.add_argument("--warmup-s", type=float, default=None, help="default: 20%% of the run, 10-60 s")
    p.add_argument("--render-cache-mib", type=float, default=16.0,
                   help="the renderer's segment cache budget (GATEWAY_RENDER_CACHE_BYTES; the gateway's default is "
                        "256): small, so bounded caches are full by the end of warm-up and later growth is a leak")
    p.add_argument("--state-mib", type=float, default=16.0,
                   help="the in-memory state store's budget (GATEWAY_STATE_MAX_BYTES; the gateway's default is 256): "
                        "small for the same reason")
    p.add_argument("--sample-s", type=float, default=30.0)
    p.add_argument("--redis", default=None, help="redis://... for the gateway's state (default: memory)")
    p.add_argument("--analysis-nice", type=int, default=None,
                   help="the niceness of the analysis worker's polite batches "
                        "(GATEWAY_ANALYSIS_NICE; the gateway's default is 5)")
    p.add_argument("--verbose", "-v", action="store_true")
    args = p.parse_args(argv)
    if args.conversations < args.concurrency:
        p.error("--conversations must be at least --concurrency (an agent waits for its answer)")

    emu_knobs = {"flavour": "vllm", "decode_tps": args.decode_tps, "ttft_ms": args.ttft_ms, "reasoning_tokens": 4,
                 "recent_requests": 16}
    with run_emulator(**emu_knobs, fail_rate=args.fail_rate) as e1, \
            run_emulator(**emu_knobs, fail_rate=args.fail_rate) as e2, \
            run_emulator(**emu_knobs, die_after_chunks=3) as dying:
        lane = {"engine": "vllm", "upstream_model": "deepseek-v4-flash", "qualification": "not_required",
                "timeouts": {"connect": 2, "first_byte": 30, "idle": 10}, "routing": "least_inflight"}
        routes = {
            "gateway": {"client_keys": {"env": "SOAK_CLIENT_KEYS"}, "admin_key_env": "SOAK_ADMIN_KEY"},
            "lanes": {
                # 5% of answers are 500s: five in a row on one replica (p = 3e-7) opens its breaker.
                "main": {**lane, "replicas": [e1.url, e2.url], "breaker": {"failures": 5, "cool_down_s": 2}},
                "dying": {**lane, "replicas": [dying.url], "breaker": {"failures": 1_000_000, "cool_down_s": 1}},
            },
            "models": {"soak": "main", "soak-die": "dying"},
        }
        env = {"SOAK_CLIENT_KEYS": KEY, "SOAK_ADMIN_KEY": ADMIN, "GATEWAY_LOG_LEVEL": "warning",
               "GATEWAY_RENDER_CACHE_BYTES": str(int(args.render_cache_mib * 1024 * 1024)),
               "GATEWAY_STATE_MAX_BYTES": str(int(args.state_mib * 1024 * 1024))}
        if args.redis:
            env["GATEWAY_REDIS_URL"] = args.redis
        if args.analysis_nice is not None:
            env["GATEWAY_ANALYSIS_NICE"] = str(args.analysis_nice)
        with run_gateway(routes, env=env) as gw:
            pid = gw.proc.pid
            duration = args.seconds if args.seconds else args.minutes * 60
            print(f"soak: {duration:.0f} s at concurrency {args.concurrency}, fail_rate {args.fail_rate}, "
                  f"{args.die_share:.0%} of streams to a dying lane, gateway pid {pid}", flush=True)
            tally, rss, series = asyncio.run(drive(gw.url, pid, args))
            stats = [e.stats() for e in (e1, e2, dying)]
            cpu = cpu_s(pid)
            t_drain = time.monotonic()
            overview = gateway_overview(gw.url)
            while (overview.get("aftermath") or {}).get("queued") and time.monotonic() - t_drain < 30:
                time.sleep(0.2)  # the turns still queued for analysis when traffic stopped
                overview = gateway_overview(gw.url)
            log = gw.log()

    total = tally.done
    unexpected = {k: v for k, v in tally.kinds.items() if k.startswith("unexpected")}
    growth = (rss["end"] - rss["after_warmup"]) / rss["after_warmup"]
    everything = tally.latency["stream"] + tally.latency["whole"]
    print()
    print(f"requests           {total} in {rss['duration_s']:.0f} s ({total / rss['duration_s']:.0f}/s)")
    print("outcomes:")
    for kind, n in sorted(tally.kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {n:8d}  {n / max(1, total):7.2%}  {kind}")
    for kind, detail in tally.examples.items():
        print(f"  e.g. {kind}: {detail}")
    injected_500 = sum(s["errors"].get("injected_500", 0) for s in stats[:2])
    print(f"engine-side injected 500s {injected_500}, engine requests "
          f"{stats[0]['requests']} + {stats[1]['requests']} (main), {stats[2]['requests']} (dying)")
    print("latency of successful requests (s):")
    for name, values in (("all", everything), ("streaming", tally.latency["stream"]),
                         ("non-streaming", tally.latency["whole"]), ("stream first byte", tally.ttfb)):
        print(f"  {name:18s} n={len(values):7d}  p50={percentile(values, 50):.4f}  p99={percentile(values, 99):.4f}")
    print(f"gateway RSS (MiB, with its analysis worker): start {rss['start']:.1f}, "
          f"after {rss['warmup_s']:.0f} s warm-up {rss['after_warmup']:.1f}, "
          f"end {rss['end']:.1f} ({rss['end_parts']}); growth after warm-up {growth:+.1%}")
    if series:
        print("  samples (t s, MiB, requests): " + ", ".join(f"({t:.0f}, {m:.1f}, {n})" for t, m, n in series))
        after = [x for x in series if x[0] >= rss["warmup_s"]] + [(rss["duration_s"], rss["end"], total)]
        if len(after) >= 3:
            half = len(after) // 2
            for name, part in (("first half", after[:half + 1]), ("second half", after[half:])):
                (t0, m0, n0), (t1, m1, n1) = part[0], part[-1]
                per_req = (m1 - m0) * 1024 * 1024 / max(1, n1 - n0)
                print(f"  after warm-up, {name}: {(m1 - m0) / max(1e-9, t1 - t0) * 60:+.1f} MiB/min "
                      f"({per_req:+.0f} bytes per request)")
    if overview:
        after = overview.get("aftermath") or {}
        print(f"gateway: processed {after.get('processed')}, analysed {after.get('analysed')} "
              f"({after.get('analysis_inline')} on the event loop), analysis shed "
              f"{after.get('skipped_analysis')} (superseded {after.get('shed_superseded')}, queue full "
              f"{after.get('shed_queue_full')}), failed {after.get('analysis_failures')}; "
              f"records {overview.get('records')}")
        worker = after.get("analysis_worker_pid")
        gw_cpu = cpu.get(pid, (0.0, 0))[0]
        w_cpu, w_nice = cpu.get(worker, (0.0, 0)) if worker else (0.0, 0)
        print(f"CPU: gateway process {gw_cpu:.1f} s ({gw_cpu * 1000 / max(1, total):.2f} ms per request), analysis "
              f"worker {w_cpu:.1f} s ({w_cpu * 1000 / max(1, after.get('analysed') or 0):.2f} ms per analysed turn); "
              f"{after.get('analysis_batches_behind')} of its {after.get('analysis_batches')} batches sent behind "
              f"(run at the event loop's priority; the others at niceness {w_nice})")
        ok_turns = tally.kinds.get("ok", 0)
        print(f"verdict share: {(after.get('analysed') or 0) / max(1, ok_turns):.1%} of {ok_turns} completed turns "
              f"got a verdict (target >= 95%)")
        for lane in overview.get("lanes", []):
            reps = ", ".join(f"{r['url']} requests={r['requests']} failures={r['failures']} "
                             f"breaker_open={r['breaker_open']}" for r in lane["replicas"])
            print(f"  lane {lane['name']}: {reps}")
    tracebacks = log.count("Traceback")
    print(f"gateway log: {tracebacks} tracebacks")
    ok = not unexpected and growth < 0.10 and tracebacks == 0 and total > 0
    print("RESULT:", "PASS" if ok else "FAIL",
          "(only injected faults failed, cleanly; RSS growth after warm-up < 10%)" if ok else "")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
