"""The seed's incident replayed on the emulator, with and without cache-protecting admission.

    .venv/bin/python bench/admission_replay.py [--pool 48000]

Two long agent sessions share a lane whose pool holds both of them but not them and the newcomers that
arrive while they run; every session grows each turn and thinks briefly between turns. Without admission
everyone runs at once and the pool (LRU, like the engines) evicts prefixes that are needed again a
moment later: those turns are prefilled again. With `admission: {policy: hold}` the newcomers wait until
the long sessions end; with `{policy: divert}` they go to a second lane of the same size. Every mode in
one run, the same emulator settings (prefill paced); printed: re-prefilled tokens (uncached tokens beyond
each turn's new ones), turns completed, and the time until every session is done.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.routes import lane  # noqa: E402
from tests.support.emulator_proc import run_emulator  # noqa: E402
from tests.support.gateway_proc import run_gateway  # noqa: E402

WORD = "lorem "  # two tokens with the emulator's DeepSeek tokenizer


@dataclass
class Session:
    name: str
    start_at: float  # seconds after the run starts
    first_tokens: int
    growth_tokens: int
    turns: int
    done_turns: int = 0
    reprefilled: int = 0
    finished_at: float | None = None
    refused: int = 0
    usage: list[tuple[int, int, int]] = field(default_factory=list)  # prompt, cached, completion

    def run(self, url: str, t0: float, think_s: float) -> None:
        delay = t0 + self.start_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        messages = [{"role": "user", "content": f"{self.name}: " + WORD * (self.first_tokens // 2)}]
        with httpx.Client(base_url=url, timeout=600) as client:
            while self.done_turns < self.turns:
                r = client.post("/v1/chat/completions", json={"model": "ds", "max_tokens": 16, "messages": messages})
                if r.status_code == 429:
                    self.refused += 1
                    time.sleep(float(r.headers.get("retry-after", "1")))
                    continue
                r.raise_for_status()
                body = r.json()
                u = body["usage"]
                prompt, completion = u["prompt_tokens"], u["completion_tokens"]
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                if self.usage:
                    last_prompt, _, last_completion = self.usage[-1]
                    new = prompt - (last_prompt + last_completion)
                    self.reprefilled += max(0, prompt - cached - max(0, new))
                self.usage.append((prompt, cached, completion))
                self.done_turns += 1
                messages = messages + [
                    {"role": "assistant", "content": body["choices"][0]["message"].get("content") or ""},
                    {"role": "user", "content": f"turn {self.done_turns}: " + WORD * (self.growth_tokens // 2)}]
                time.sleep(think_s)  # the agent runs its tool
        self.finished_at = time.monotonic() - t0


def sessions(pool: int) -> list[Session]:
    """Four sessions that each grow from 0.2 to ~0.43 of the pool: two at once fit, four do not."""
    first, growth = pool // 5, pool // 40
    return [Session("long-a", 0.0, first, growth, 10), Session("long-b", 0.2, first, growth, 10),
            Session("new-a", 1.0, first, growth, 10), Session("new-b", 2.0, first, growth, 10)]


def replay(mode: str, emu, overflow, pool: int, think_s: float) -> list[Session]:
    emu.reset()
    overflow.reset()
    protect = {"hold_s": 600, "idle_after_s": 2.0, "reserve_tokens": pool * 45 // 100, "pool_tokens": pool}
    lanes = {"ds": lane(emu.url, admission={"policy": "admit"})}
    if mode == "hold":
        lanes["ds"] = lane(emu.url, admission={"policy": "hold", **protect})
    elif mode == "divert":  # a second lane of the same size takes the newcomers the first cannot hold
        lanes["ds"] = lane(emu.url, admission={"policy": "divert", "divert_to": ["ds-b"], **protect})
        lanes["ds-b"] = lane(overflow.url, admission={"policy": "hold", **protect})
    routes = {"lanes": lanes, "models": {"ds": "ds"}}
    with run_gateway(routes) as gw:
        all_sessions = sessions(pool)
        t0 = time.monotonic()
        threads = [threading.Thread(target=s.run, args=(gw.url, t0, think_s)) for s in all_sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return all_sessions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", type=int, default=48_000, help="the engine's pool in tokens")
    ap.add_argument("--prefill-tps", type=float, default=5_000.0, help="the demo's prefill rate")
    ap.add_argument("--think-s", type=float, default=0.3)
    ap.add_argument("--prefill-shared", action="store_true",
                    help="one prefill compute for all requests in arrival order (the emulator's prefill_shared)")
    args = ap.parse_args()
    knobs = {"flavour": "vllm", "tokenizer": "dsv41", "block_size": 16, "cache_blocks": args.pool // 16,
             "prefill_tps": args.prefill_tps, "prefill_shared": args.prefill_shared, "decode_tps": 0,
             "output_tokens": 16, "reasoning_tokens": 0}
    with run_emulator(**knobs) as emu, run_emulator(**knobs) as overflow:
        results = {mode: replay(mode, emu, overflow, args.pool, args.think_s) for mode in ("admit", "hold", "divert")}
    print(f"pool {args.pool:,} tokens, prefill {args.prefill_tps:,.0f} tok/s"
          f"{' shared' if args.prefill_shared else ' per request'}, think {args.think_s} s; "
          f"2 long sessions + 2 newcomers; divert: a second lane of the same pool takes the newcomers")
    print(f"{'mode':>6} {'re-prefilled tokens':>20} {'turns':>6} {'all done (s)':>13} {'refused':>8}  "
          "per session (done s)")
    for mode, ss in results.items():
        reprefilled = sum(s.reprefilled for s in ss)
        turns = sum(s.done_turns for s in ss)
        done = max(s.finished_at or 0.0 for s in ss)
        per = ", ".join(f"{s.name} {s.finished_at:.1f}" for s in ss)
        print(f"{mode:>6} {reprefilled:>20,} {turns:>6} {done:>13.1f} {sum(s.refused for s in ss):>8}  {per}")


if __name__ == "__main__":
    main()
