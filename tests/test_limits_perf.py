"""Cost of the limits on the hot path, on the 1,600-message agent corpus (shared/tools/make_agent_corpus.py).

Prints the per-request cost of each lane configuration (run with -s to see it) and guards against
regressions that would be gross on a 2 MB body (a deep copy, a second pass, an exact count on every
request): the bound is loose on purpose, machines here are shared.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from gateway.core.exchange import Exchange
from gateway.limits import LimitsPolicy
from gateway.core.runtime import LaneRuntime
from tests.support.routes import lane_config

TOOL = Path("/work/shared/tools/make_agent_corpus.py")
PH = "<｜deepseek_image｜>"
DSV41 = {"max_images": 4, "max_top_logprobs": 32, "max_context_tokens": 1_048_576, "placeholder_tokens": [PH]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> bytes:
    if not TOOL.exists():
        pytest.skip("the corpus tool is not on this machine")
    out = tmp_path_factory.mktemp("corpus") / "agent.json"
    subprocess.run([sys.executable, str(TOOL), "-o", str(out)], check=True, capture_output=True)
    return out.read_bytes()


def lane(**limits) -> LaneRuntime:
    return LaneRuntime("l", lane_config(limits=limits), None, None)  # type: ignore[arg-type]


def measure(raw: bytes, ln: LaneRuntime, n: int = 25, mutate=None) -> tuple[tuple[float, float], Exchange, dict, dict]:
    policy = LimitsPolicy()
    policy.attach(ln)
    times = []
    for _ in range(n):
        body = orjson.loads(raw)  # a fresh body each time, as the gateway parses one per request
        if mutate:
            mutate(body)
        before = dict(body)
        ex = Exchange(request_id="perf")
        ex.body_bytes = len(raw)
        times.append(_loop.run_until_complete(_timed(policy.apply(ex, ln, body))))
    return (statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)), ex, before, body


_loop = asyncio.new_event_loop()


async def _timed(coro) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()  # wall, and CPU (less noisy on a shared machine)
    await coro
    return (time.perf_counter() - t) * 1e6, (time.process_time() - c) * 1e6


def add_images(body: dict) -> None:
    msgs = body["messages"]
    for k in range(6):
        i = 10 + k * 200
        msgs[i] = {**msgs[i], "role": "user", "content": [
            {"type": "text", "text": "screenshot"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,AAAA{k}"}}]}


def test_cost_on_the_agent_corpus(corpus, capsys):
    rows = []
    us, ex, before, body = measure(corpus, lane())
    rows.append(("no limits configured", us))
    us, ex, before, body = measure(corpus, lane(**DSV41))
    rows.append(("dsv41 lane: images, top_logprobs, placeholders, 1M window", us))
    assert body["messages"] is before["messages"], "an untouched request must not be copied"
    assert ex.limits_fired == [] and ex.limits.prompt_tokens_counted is None
    us, ex, before, body = measure(corpus, lane(max_images=4))
    rows.append(("images only", us))
    us, ex, before, body = measure(corpus, lane(max_images=4, images_policy="drop_oldest"), mutate=add_images)
    rows.append(("images drop_oldest, 6 images in history (rewrite)", us))
    assert ex.limits_fired == ["max_images"]
    changed = [i for i, (a, b) in enumerate(zip(before["messages"], body["messages"])) if a is not b]
    assert changed == [10, 210], "only the rewritten messages are new objects"
    us, ex, before, body = measure(corpus, lane(max_context_tokens=600_000), n=5)
    rows.append(("window 600K: near the window, exact count (cl100k, thread)", us))
    assert ex.limits.prompt_tokens_counted["how"] == "cl100k"
    with capsys.disabled():
        print(f"\nlimits cost per request, {len(corpus) / 1e6:.2f} MB, "
              f"{len(orjson.loads(corpus)['messages'])} messages (median):")
        print(f"  {'wall us':>10} {'cpu us':>10}")
        for name, (wall, cpu) in rows:
            print(f"  {wall:10.0f} {cpu:10.0f}  {name}")
    assert rows[1][1][1] < 50_000  # gross-regression guard only, CPU time (typical: 1-2 ms)
