"""One request never stalls the others: a huge prompt on a lane that counts tokens exactly, and a body of a
million JSON members, run beside live streams, and the largest gap between the streams' chunks stays near
a control run's. Memory comes back: RSS after ten huge prompts stays within the documented bound
(docs/operating/limits.md)."""

from __future__ import annotations

import threading
import time

import httpx
import orjson

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until
from tests.support.routes import lane, routes

STREAM_TOKENS = 400
DECODE_TPS = 100.0  # a chunk every 10 ms


def _largest_gap(url: str, out: list[float]) -> None:
    body = {"model": "streams", "stream": True, "max_tokens": STREAM_TOKENS,
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    last, worst = None, 0.0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for _ in resp.iter_raw():
            now = time.perf_counter()
            if last is not None:
                worst = max(worst, now - last)
            last = now
    out.append(worst)


def _streams_beside(url: str, heavy: list[dict] | None) -> float:
    gaps: list[float] = []
    threads = [threading.Thread(target=_largest_gap, args=(url, gaps)) for _ in range(2)]
    for t in threads:
        t.start()
    for body in heavy or ():
        r = httpx.post(url + "/v1/chat/completions", content=orjson.dumps(body), timeout=120,
                       headers={"Content-Type": "application/json"})
        assert r.status_code < 500, r.text[:300]
        if len(body) > 1000:
            assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_members", r.text[:300]
    for t in threads:
        t.join()
    assert len(gaps) == 2
    return max(gaps)


def test_huge_prompts_do_not_stall_other_streams() -> None:
    with run_emulator(flavour="vllm", decode_tps=DECODE_TPS, output_tokens=STREAM_TOKENS) as streams, \
            run_emulator(flavour="vllm", tokenizer="dsv41", output_tokens=4, max_model_len=1 << 21) as heavy:
        lanes = {"streams": lane(streams.url),
                 "heavy": lane(heavy.url, render={"template": "deepseek_v4.1"},
                               limits={"max_context_tokens": 1 << 20, "max_request_bytes": 64 << 20})}
        with run_gateway(routes(lanes)) as gw:
            words = " ".join(f"w{i % 9973}x{i % 31}" for i in range(1_200_000))  # ~11 MB of varied words
            huge = [
                {"model": "heavy", "max_tokens": 4, "messages": [{"role": "user", "content": words}]},
                {"model": "heavy", "max_tokens": 4, "messages": [{"role": "user", "content": "hello " * 900_000}]},
                {"model": "heavy", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                 **{f"k{i}": i for i in range(1_000_000)}},
            ]
            _streams_beside(gw.url, None)  # warm both paths
            control = _streams_beside(gw.url, None)
            loaded = _streams_beside(gw.url, huge)
            # A stall of the event loop shows as a gap of seconds; the bound is wider than 2x contention
            # on two cores and the control's own jitter.
            print(f"largest gap: control {control * 1000:.0f} ms, beside huge prompts {loaded * 1000:.0f} ms")
            assert loaded < 0.1 + 4 * control, (loaded, control)


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


# The documented bound (docs/performance.md): the render cache's budget, the history memo's and this.
RSS_OWN_MARGIN_MIB = 192


def test_memory_comes_back_after_huge_prompts() -> None:
    """Ten huge prompts counted exactly: each tokenization briefly takes hundreds of MB; afterwards the
    process holds what its caches may hold, not the peaks."""
    from gateway.pipeline.history_memo import DEFAULT_MAX_BYTES
    from gateway.render.cache import DEFAULT_BUDGET_BYTES

    with run_emulator(flavour="vllm", tokenizer="dsv41", output_tokens=4, max_model_len=1 << 23) as heavy:
        lanes = {"heavy": lane(heavy.url, render={"template": "deepseek_v4.1"},
                               limits={"max_context_tokens": 1 << 22, "max_request_bytes": 64 << 20})}
        with run_gateway(routes(lanes)) as gw:
            pid = gw.proc.pid
            small = {"model": "heavy", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
            assert httpx.post(gw.url + "/v1/chat/completions", json=small, timeout=60).status_code == 200
            before = _rss_mib(pid)
            peak = before
            for n in range(10):
                words = " ".join(f"w{(n * 7919 + i) % 9973}x{i % 31}" for i in range(500_000))  # ~4.4 MB
                body = {"model": "heavy", "max_tokens": 4, "messages": [{"role": "user", "content": words}]}
                r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=120)
                assert r.status_code < 500, r.text[:300]
                peak = max(peak, _rss_mib(pid))
            # Settled: the counts that outlived their request (forwarded unchecked) have finished.
            readings: list[int] = []
            sampled = [0.0]

            def settled() -> bool:  # three readings a second apart within 4 MiB
                if time.monotonic() - sampled[0] >= 1.0:
                    sampled[0] = time.monotonic()
                    readings.append(_rss_mib(pid))
                return len(readings) >= 3 and max(readings[-3:]) - min(readings[-3:]) <= 4

            wait_until(settled, timeout=120, what="RSS settled")
            after = readings[-1]
            bound = (DEFAULT_BUDGET_BYTES + DEFAULT_MAX_BYTES) // 2**20 + RSS_OWN_MARGIN_MIB
            print(f"RSS: before {before} MiB, peak {peak} MiB, after {after} MiB (bound +{bound} MiB)")
            assert after - before <= bound, (before, peak, after, bound)
