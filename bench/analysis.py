#!/usr/bin/env python3
"""What the conversation analysis costs, in CPU, and whether it keeps up with the traffic.

    python bench/analysis.py                      # all four figures (the soak part runs 60 s)
    python bench/analysis.py --soak-seconds 300   # the 5-minute soak
    python bench/analysis.py --soak-seconds 0     # skip the soak

Prints:
1. analysis CPU of an append-only turn of the agent corpus (~473K tokens, ~1,600 messages;
   ../shared/tools/make_agent_corpus.py): the worker's `analyse_job` with the previous turn's memo
   (the unchanged history recognised from its bytes) and, for comparison, the full path;
2. analysis CPU of a new 1,600-message conversation: its items already rendered by another
   conversation (a fleet of agents on one task: the render cache is warm), and from nothing, tokenised
   or with the engine's prompt ids (vLLM's `return_token_ids`) cut into its segments; and from
   nothing, and the append-only turn, with the render and tokenizer shortcuts off and on, alternated
   (--ab-rounds);
3. the gateway-side cost of handing a job to the analysis worker process (pickle or spool, the
   executor's pipe, the futures), as CPU of the gateway process per job, small and corpus-sized;
4. the soak's verdict share (bench/soak.py): turns that got a verdict among those completed.

CPU is process time (both cores count), so the figures hold on a loaded machine; medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as in the analysis worker (worker.py): one core

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.conversations.analysis import analyse_job  # noqa: E402
from gateway.conversations.job import Job  # noqa: E402
from gateway.conversations.memo import memos  # noqa: E402
from gateway.conversations.state import ConversationState  # noqa: E402
from gateway.conversations.worker import AnalysisProcess  # noqa: E402
from gateway.render.cache import SegmentCache  # noqa: E402
from gateway.render import tokenizer as tokenizer_mod  # noqa: E402
from gateway.render.renderer import Renderer  # noqa: E402
from gateway.render.result import RenderOptions  # noqa: E402

tokenizer_mod.PIECES_MAX_CHARS = None  # as in the analysis worker (worker.py): the analysis's own process

SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
USAGE = {"prompt_tokens": 1, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}


def corpus(path: Path) -> dict:
    if not path.exists():
        subprocess.run([sys.executable, str(SHARED / "tools" / "make_agent_corpus.py"), "-o", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())


def job(cid: str, body: dict, messages: list, options: RenderOptions, stored: bytes | None,
        state: ConversationState | None = None, as_bytes: bool = True, engine_ids: bool = False) -> Job:
    """`engine_ids`: with the ids vLLM returns (`return_token_ids`) and the blocks keyed (KV events)."""
    data = dict(body, model="deepseek-v4-flash", messages=messages, max_tokens=8, stream=False)
    said = {"role": "assistant", "content": "Done.", "reasoning_content": "Looked at it."}
    j = Job("bench", "ds", options, options, 16, options.engine, 5000.0, orjson.dumps(data) if as_bytes else data,
            said, "stop", USAGE, options.thinking, options.reasoning_effort, None, None, False, False,
            state or ConversationState(cid, "key"))
    j.stored = stored
    if engine_ids:
        j.prompt_token_ids = orjson.dumps(_ids_of.render(data, options).token_ids)
        j.kv_block_size = 16
    return j


_ids_of = Renderer(cache=SegmentCache())  # the engine's side: its ids of each prompt, not timed


def cpu_ms(fn) -> tuple[float, object]:
    c = time.process_time()
    out = fn()
    return (time.process_time() - c) * 1000, out


def append_only(body: dict, options: RenderOptions, turns: int) -> None:
    msgs = body["messages"]
    said = {"role": "assistant", "content": "Done.", "reasoning_content": "Looked at it."}
    for label, as_bytes, ids in (("with the memo (bytes recognised)", True, False),
                                 ("with the memo, the engine's ids checked and blocks keyed", True, True),
                                 ("full path (parsed body, no memo)", False, False)):
        memos().clear()
        renderer = Renderer(options, cache=SegmentCache())
        history = msgs[:[i for i, m in enumerate(msgs) if m["role"] == "assistant"][-1]]
        first = job("c", body, history, options, None, as_bytes=as_bytes, engine_ids=ids)
        cold, out = cpu_ms(lambda first=first, renderer=renderer: analyse_job(first, renderer, None))
        times = []
        for k in range(turns):
            history = [*history, said, {"role": "user", "content": f"Step {k}: go on."}]
            state = ConversationState.from_bytes(out.data)
            j = job("c", body, history, options, out.data, state, as_bytes, engine_ids=ids)
            ms, out = cpu_ms(lambda j=j, renderer=renderer: analyse_job(j, renderer, None))
            times.append(ms)
        print(f"  append-only turn, {label}: median {statistics.median(times):.2f} ms, max {max(times):.2f} ms "
              f"over {turns} turns ({out.cache.rendered_prompt_tokens} tokens, verdict {out.cache.verdict}; "
              f"the first turn {cold:.0f} ms)   target <= 5 ms")


def new_conversation(body: dict, options: RenderOptions, n: int) -> None:
    msgs = body["messages"]
    renderer = Renderer(options, cache=SegmentCache())
    memos().clear()
    cold, _ = cpu_ms(lambda: analyse_job(job("first", body, msgs, options, None), renderer, None))
    warm = [cpu_ms(lambda k=k: analyse_job(job(f"new{k}", body, msgs, options, None), renderer, None))[0]
            for k in range(n)]
    print(f"  new {len(msgs)}-message conversation, its items rendered before (warm render cache): median "
          f"{statistics.median(warm):.1f} ms over {n}   target <= 300 ms")
    print(f"  new {len(msgs)}-message conversation from nothing (render + tokenise every message): {cold:.0f} ms")
    # The same from nothing, where the engine returned the ids it prefilled (vLLM, `token_ids: auto`):
    # they are cut into the segments (render/engine_ids.py) instead of tokenising; alternated with the above.
    ids = orjson.dumps(Renderer(options, cache=SegmentCache()).render(body, options).token_ids)
    pairs: dict[str, list[float]] = {"tokenised": [], "engine ids": []}
    for k in range(n):
        for label, prompt in (("tokenised", None), ("engine ids", ids)):
            memos().clear()
            j = job(f"ids{k}{label}", body, msgs, options, None)
            j.prompt_token_ids = prompt
            fresh = Renderer(options, cache=SegmentCache())
            pairs[label].append(cpu_ms(lambda j=j, fresh=fresh: analyse_job(j, fresh, None))[0])
    print(f"  new {len(msgs)}-message conversation from nothing, alternated over {n}: " +
          ", ".join(f"{k} median {statistics.median(v):.0f} ms" for k, v in pairs.items()) + "   target <= 300 ms")


def shortcuts_ab(body: dict, options: RenderOptions, rounds: int, turns: int) -> None:
    """The render and tokenizer shortcuts (render/native.py, render/pieces.py) off and on, alternated in
    this process: the new conversation from nothing (fresh render cache; `on, table cold` also empties
    the piece table: a worker's first conversation), and the append-only turn with the memo."""
    from gateway.render.template import load_template
    from gateway.render.tokenizer import load_tokenizer

    tok, template = load_tokenizer(options.tokenizer_path), load_template(options.template)
    pieces, native = tok._pieces, template.native
    msgs = body["messages"]
    said = {"role": "assistant", "content": "Done.", "reasoning_content": "Looked at it."}

    def switch(on: bool) -> None:
        tok._pieces, template.native = (pieces, native) if on else (None, None)

    def new(on: bool, cold: bool = False) -> float:
        switch(on)
        if cold and pieces is not None:
            pieces._pieces = {}
        renderer = Renderer(options, cache=SegmentCache())
        memos().clear()
        return cpu_ms(lambda: analyse_job(job("ab", body, msgs, options, None), renderer, None))[0]

    def append(on: bool) -> float:
        switch(on)
        memos().clear()
        renderer = Renderer(options, cache=SegmentCache())
        history = msgs[:[i for i, m in enumerate(msgs) if m["role"] == "assistant"][-1]]
        out = analyse_job(job("c", body, history, options, None), renderer, None)
        times = []
        for k in range(turns):
            history = [*history, said, {"role": "user", "content": f"Step {k}: go on."}]
            j = job("c", body, history, options, out.data, ConversationState.from_bytes(out.data))
            ms, out = cpu_ms(lambda j=j: analyse_job(j, renderer, None))
            times.append(ms)
        return statistics.median(times)

    got: dict[str, list[float]] = {"off": [], "on, table cold": [], "on": []}
    turn: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for _ in range(rounds):
            got["off"].append(new(False))
            got["on, table cold"].append(new(True, cold=True))
            got["on"].append(new(True))
            turn["off"].append(append(False))
            turn["on"].append(append(True))
    finally:
        switch(True)
    print(f"  shortcuts off / on (render/native.py, render/pieces.py), {rounds} alternated rounds:")
    print(f"    new {len(msgs)}-message conversation from nothing: " +
          ", ".join(f"{k} median {statistics.median(v):.0f} ms" for k, v in got.items()) + "   target <= 300 ms")
    print(f"    append-only turn with the memo (median of {turns} turns each round): " +
          ", ".join(f"{k} median {statistics.median(v):.2f} ms" for k, v in turn.items()) + "   target <= 5 ms")


def hand_off(body: dict, options: RenderOptions, n_small: int, n_big: int) -> None:
    """Gateway-process CPU per job through the real worker process (pickling, the pipe)."""
    small = {"messages": [{"role": "system", "content": "You are agent 1."}, {"role": "user", "content": "Step 1."}]}

    async def run(jobs: list[Job], process: AnalysisProcess, concurrent: int) -> float:
        sem = asyncio.Semaphore(concurrent)

        async def one(j: Job) -> None:
            async with sem:
                await process.run(j)

        c = time.process_time()
        await asyncio.gather(*(one(j) for j in jobs))
        return (time.process_time() - c) * 1000 / len(jobs)

    async def main() -> None:
        process = AnalysisProcess()
        process.start([options])
        try:
            await process.run(job("warm", small, small["messages"], options, None))  # spawned, loaded
            for concurrent in (1, 16):
                ms = await run([job(f"s{k}", small, small["messages"], options, None) for k in range(n_small)],
                               process, concurrent)
                print(f"  hand-off, small job, {concurrent:2d} in flight: {ms * 1000:.0f} us of gateway CPU per job "
                      f"({process.jobs / max(1, process.batches):.1f} jobs per batch so far)")
            data = job("b", body, body["messages"], options, None)
            size = len(data.body)
            await process.run(data)
            ms = await run([job("b", body, body["messages"], options, None) for _ in range(n_big)], process, 1)
            print(f"  hand-off, corpus job ({size / 1e6:.2f} MB, through the shared-memory ring): {ms:.2f} ms of "
                  f"gateway CPU per job")
        finally:
            process.stop()

    asyncio.run(main())


def soak(seconds: float) -> None:
    print(f"  running bench/soak.py --seconds {seconds:.0f} ...", flush=True)
    out = subprocess.run([sys.executable, str(REPO / "bench" / "soak.py"), "--seconds", str(seconds)],
                         capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if re.match(r"^(requests|verdict share|gateway: processed)", ln)]
    for ln in lines:
        print("  soak: " + ln.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/tmp/agent.json")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--soak-seconds", type=float, default=60.0)
    ap.add_argument("--ab-rounds", type=int, default=5, help="rounds of the shortcuts' off/on A/B (0: none)")
    a = ap.parse_args()
    body = corpus(Path(a.corpus))
    options = RenderOptions(thinking=True, reasoning_effort=body.get("reasoning_effort"), engine="vllm")
    from gateway.render.template import load_template
    from gateway.render.tokenizer import load_tokenizer

    load_tokenizer(options.tokenizer_path).spelling(), load_template(options.template)  # as the worker's preload
    from gateway.observe import gc_tuning

    gc_tuning.settle("")  # the collector as the worker sets it
    print(f"analysis CPU (process time; cores={os.cpu_count()}, load average {os.getloadavg()[0]:.1f}):")
    append_only(body, options, a.turns)
    new_conversation(body, options, 5)
    if a.ab_rounds:
        shortcuts_ab(body, options, a.ab_rounds, a.turns)
    hand_off(body, options, 300, 10)
    if a.soak_seconds > 0:
        soak(a.soak_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
