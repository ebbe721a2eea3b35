#!/usr/bin/env python3
"""Benchmark the DeepSeek-V4.1 renderer on a long coding-agent conversation.

    python bench/render_bench.py                 # generates /tmp/agent.json if missing
    python bench/render_bench.py --corpus agent.json --turns 40

Prints: cold render + tokenize of the full conversation; warm append-one-turn cost (turn k after
turns < k were seen); template-render-only times; segment-cache bytes for the conversation.
An append-only client's turn k is the conversation up to (not including) its k-th assistant message.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.render import Rendered, Renderer, RenderOptions, SegmentCache  # noqa: E402
from gateway.render.estimate import Estimator  # noqa: E402
from gateway.render.template import load_template  # noqa: E402
from gateway.render.tokenizer import load_tokenizer  # noqa: E402

SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))


def ms(x: float) -> str:
    return f"{x * 1000:8.1f} ms"


def timed(fn, repeat: int = 1):
    best, out, times = None, None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    best = statistics.median(times)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/tmp/agent.json")
    ap.add_argument("--turns", type=int, default=40, help="number of warm append turns to time")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    path = Path(a.corpus)
    if not path.exists():
        tool = SHARED / "tools" / "make_agent_corpus.py"
        print(f"generating {path} with {tool} ...", flush=True)
        subprocess.run([sys.executable, str(tool), "-o", str(path)], check=True)
    body = json.loads(path.read_text())
    msgs = body["messages"]
    opts = RenderOptions(thinking=True, reasoning_effort=body.get("reasoning_effort"))

    t0 = time.perf_counter()
    tok = load_tokenizer()
    load_template(opts.template)
    print(f"setup (tokenizer + template load, once per process): {ms(time.perf_counter() - t0)}")
    print(f"corpus: {len(msgs)} messages, {len(json.dumps(body)) / 1e6:.2f} MB JSON, cores={os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f} (other processes share these cores)")

    # -- cold --------------------------------------------------------------------------------------
    def cold():
        r = Renderer(opts, cache=SegmentCache())
        return r.render(body, opts)

    c0 = time.process_time()
    t_cold, rendered = timed(cold, a.repeat)
    cpu_cold = (time.process_time() - c0) / a.repeat
    n_tok = rendered.n_tokens
    print(f"\nprompt: {n_tok} tokens, {len(rendered.prompt)} chars, {len(rendered.segments)} segments")
    print(f"cold render + tokenize (fresh cache, median of {a.repeat}): {ms(t_cold)}   target <= 1500 ms"
          f"   (CPU {ms(cpu_cold)} over both cores)")
    t_items, _ = timed(lambda: Renderer(opts, cache=SegmentCache()).render_text(body, opts), a.repeat)
    print(f"  of which per-item template render (fresh cache):       {ms(t_items)}")
    texts = [s.text for s in rendered.segments]
    t_batch, _ = timed(lambda: tok.encode_batch(texts), a.repeat)
    print(f"  of which encode_batch over {len(texts)} segments:         {ms(t_batch)}")
    t_single, whole = timed(lambda: tok.encode(rendered.prompt), 1)
    print(f"reference: single-threaded encode of the whole prompt:    {ms(t_single)}")
    assert list(whole) == rendered.token_ids, "segment tokenization differs from whole-prompt tokenization"

    # -- template only -------------------------------------------------------------------------------
    r0 = Renderer(opts, cache=SegmentCache())
    t_tpl, full = timed(lambda: r0.render_template(body, opts), a.repeat)
    assert full == rendered.prompt, "full template render differs from the per-item render"
    print(f"\ntemplate render only, full Jinja render (engine path):   {ms(t_tpl)}")
    print(f"template render only, per-item macros (fresh cache):    {ms(t_items)}")

    # -- warm append -------------------------------------------------------------------------------
    starts = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    bounds = starts[-(a.turns + 1):]  # turn k = msgs[:bound]
    cache = SegmentCache()
    rr = Renderer(opts, cache=cache)
    rr.render({**body, "messages": msgs[: bounds[0]]}, opts)  # turns < k seen (cold, untimed)
    gc.collect()
    rows = []
    for b in bounds[1:]:
        turn = {**body, "messages": msgs[:b]}
        t, c0 = time.perf_counter(), time.process_time()
        r = rr.render(turn, opts)
        dt = time.perf_counter() - t
        rows.append((dt, r.render_misses, r.token_misses, len(r.segments), r.n_tokens, time.process_time() - c0))
    w = sorted(x[0] for x in rows)
    cpu = sorted(x[5] for x in rows)
    p90 = w[int(0.9 * (len(w) - 1))]
    print(f"\nwarm append-one-turn ({len(rows)} turns, {rows[0][4]}..{rows[-1][4]} tokens):")
    print(f"  render()        median {ms(statistics.median(w))}  p90 {ms(p90)}  max {ms(w[-1])}   target <= 30 ms")
    print(f"  CPU time        median {ms(statistics.median(cpu))}  max {ms(cpu[-1])}")
    print(f"  per turn: items rendered {sorted(set(x[1] for x in rows))}, segments tokenized "
          f"{sorted(set(x[2] for x in rows))} of {rows[-1][3]}")
    r = rr.render(body, opts)
    t_arr, _ = timed(lambda: r.token_array, a.repeat)
    t_list, _ = timed(lambda: Rendered(r.segments).token_ids, a.repeat)
    print(f"  optional flat ids of the whole prompt: array('I') {ms(t_arr)}, list[int] {ms(t_list)}")
    last = rr.render(body, opts)
    assert last.token_ids == rendered.token_ids, "warm result differs from cold result"

    # same request again (retry / re-render)
    t_same, _ = timed(lambda: rr.render(body, opts), a.repeat)
    print(f"  identical request again: {ms(t_same)}")

    # -- memory ------------------------------------------------------------------------------------
    c = Renderer(opts, cache=SegmentCache())
    c.render(body, opts)
    st = c.cache.stats()
    print(f"\nsegment cache for the whole conversation: {st.bytes / 1e6:.2f} MB in {st.entries} entries "
          f"(rendered items + token ids; global LRU budget default 256 MiB)")
    n_seg = len(rendered.segments)
    fp = n_seg * (8 + 4 + 4) + (n_tok // 256 + 1) * 8
    print(f"per-conversation fingerprint if kept as (digest, tokens, chars) per segment + one 8-byte hash per "
          f"256 tokens: {fp / 1e3:.1f} KB")

    # -- estimate path -----------------------------------------------------------------------------
    est = Estimator(cache=SegmentCache())
    t_est, er = timed(lambda: Estimator(cache=SegmentCache()).render(body), 1)
    est.render(body)
    t_est_w, _ = timed(lambda: est.render(body), a.repeat)
    print(f"\nestimate lane (cl100k): cold {ms(t_est)}, warm {ms(t_est_w)}, "
          f"~{Estimator.estimated_prompt_tokens(er)} tokens")


if __name__ == "__main__":
    main()
