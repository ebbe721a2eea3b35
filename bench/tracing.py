"""What tracing costs the gateway: CPU per request with tracing off, and on (exporting to a receiver).

    .venv/bin/python bench/tracing.py [--requests 2000]

One gateway process per mode, in one run, the same scripted upstream answering a small chat completion;
requests sent one at a time. Prints the gateway's CPU (user + system, from /proc) per request and the
ratio on/off; tracing off must cost nothing measurable.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.gateway_proc import run_gateway  # noqa: E402
from tests.support.otlp_receiver import otlp_receiver  # noqa: E402
from tests.support.scripted_upstream import Script, http_response, scripted_upstream  # noqa: E402

ANSWER = (b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
          b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}')


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(mode: str, up_url: str, env: dict[str, str], n: int) -> float:
    lane = {"engine": "openai", "replicas": [up_url], "upstream_model": "m", "qualification": "not_required"}
    with run_gateway({"lanes": {"up": lane}, "models": {"pub": "up"}}, env=env) as gw, \
            httpx.Client(base_url=gw.url, timeout=10) as client:
        body = {"model": "pub", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for _ in range(200):  # warm-up
            client.post("/v1/chat/completions", json=body)
        before = cpu_s(gw.proc.pid)
        for _ in range(n):
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        per = (cpu_s(gw.proc.pid) - before) / n
    print(f"{mode:>12}: {per * 1e3:.3f} ms of gateway CPU per request ({n} requests)")
    return per


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    with otlp_receiver() as rx, scripted_upstream() as up:
        up.script = Script([http_response(200, ANSWER, [("Content-Type", "application/json")])], keep_open=True)
        off = run("tracing off", up.url, {}, args.requests)
        on = run("tracing on", up.url, {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url}, args.requests)
        off2 = run("off again", up.url, {}, args.requests)
        print(f"on - off: {(on - (off + off2) / 2) * 1e3:+.3f} ms per request; off runs differ by "
              f"{abs(off - off2) * 1e3:.3f} ms; spans received: {len(rx.spans)}")


if __name__ == "__main__":
    main()
