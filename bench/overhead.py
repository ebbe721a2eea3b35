#!/usr/bin/env python3
"""What the gateway adds on top of direct access, measured in one run (paired A/B rounds).

Starts the shared measuring stub (../shared/tools/mock_upstream.py) and the gateway in front of it
(the full product path: conversation identity, effort pinning, render + drift analysis after each
response, records, metrics), then runs ../shared/tools/loadgen.py in paired mode for each scenario
and prints one table of ratios and added milliseconds. Figures, not assertions: the machine is
shared and noisy, so only same-run ratios mean anything.

    python bench/overhead.py            # all scenarios (~2-3 minutes on 2 cores)
    python bench/overhead.py --quick    # fewer requests
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.gateway_proc import free_port, run_gateway, wait_http  # noqa: E402

SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
TOOLS = SHARED / "tools"

SCENARIOS = [
    # label, loadgen args, requests (full / quick)
    ("small non-stream c=1", ["--mode", "chat", "--concurrency", "1"], 3000, 600),
    ("small non-stream c=32", ["--mode", "chat", "--concurrency", "32"], 6000, 1500),
    ("stream 256 chunks c=1", ["--mode", "stream", "--tokens", "256", "--concurrency", "1"], 300, 80),
    ("stream 256 chunks c=32", ["--mode", "stream", "--tokens", "256", "--concurrency", "32"], 960, 320),
    # Paced like a real engine (one event every 2 ms): total time is then dominated by decode, as in use.
    ("paced stream 256 c=1", ["--mode", "stream", "--tokens", "256", "--concurrency", "1",
                              "--model", "mock-model-itl2"], 40, 16),
    ("paced stream 256 c=32", ["--mode", "stream", "--tokens", "256", "--concurrency", "32",
                               "--model", "mock-model-itl2"], 320, 128),
    ("2 MB agent body c=1", ["--mode", "chat", "--concurrency", "1", "--body-bytes", "2000000",
                             "--messages", "1600"], 200, 60),
    ("2 MB agent body c=4", ["--mode", "chat", "--concurrency", "4", "--body-bytes", "2000000",
                             "--messages", "1600"], 200, 60),
]


def routes(upstream: str, template: str | None) -> dict:
    def lane(model: str) -> dict:
        return {"engine": "vllm", "replicas": [upstream], "upstream_model": model,
                "qualification": "not_required", "render": {"template": template}}

    return {"gateway": {"max_request_bytes": 64 * 1024 * 1024},
            "lanes": {"mock": lane("mock-model"), "paced": lane("mock-model-itl2")},
            "models": {"mock-model": "mock", "mock-model-itl2": "paced"}}


def run_loadgen(label: str, args: list[str], requests: int, gw_url: str, up_url: str, gw_pid: int,
                up_pid: int) -> dict:
    out = Path(tempfile.mkdtemp()) / "report.json"
    cmd = [sys.executable, str(TOOLS / "loadgen.py"), "--target", f"direct={up_url}", "--target", f"gateway={gw_url}",
           "--rounds", "6", "--order", "abba", "--requests", str(requests), "--model", "mock-model",
           "--proc", f"gateway={gw_pid}", "--upstream-pid", str(up_pid), "--label", label,
           "--time-limit", "120", "--json-out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not out.exists():
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"loadgen failed for {label}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--template", default="deepseek_v4.1", help="lane template ('none' for estimate-only lanes)")
    ap.add_argument("--only", help="run scenarios whose label contains this")
    ap.add_argument("--json-out")
    a = ap.parse_args()

    up_port = free_port()
    mock = subprocess.Popen([sys.executable, str(TOOLS / "mock_upstream.py"), "--port", str(up_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    up_url = f"http://127.0.0.1:{up_port}"
    results = []
    try:
        wait_http(up_url + "/v1/models", 10)
        template = None if a.template == "none" else a.template
        with run_gateway(routes(up_url, template)) as gw:
            for label, args, full, quick in SCENARIOS:
                if a.only and a.only not in label:
                    continue
                rep = run_loadgen(label, args, quick if a.quick else full, gw.url, up_url, gw.proc.pid, mock.pid)
                results.append(rep)
                print(summary_line(rep), flush=True)
    finally:
        mock.terminate()
        mock.wait(5)
    print()
    print(table(results))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1, default=str))
    return 0


def summary_line(rep: dict) -> str:
    g = rep["targets"]["gateway"]
    c = g["vs_baseline"]
    errors = sum(t["errors"] for t in rep["targets"].values())
    return f"  done: {rep['label']} ({rep['elapsed_s']:.0f}s, errors {errors})" + (
        f" — added p50 {c['latency_p50_added_ms']:.2f} ms" if "latency_p50_added_ms" in c else "")


def table(results: list[dict]) -> str:
    head = (f"{'scenario':<24} {'direct p50':>10} {'gw p50':>8} {'added p50':>9} {'added p99':>9} "
            f"{'p50 x':>6} {'rps x':>6} {'ttft added':>10} {'gw CPU ms/req':>13} {'errors':>6}")
    lines = [head, "-" * len(head)]
    for rep in results:
        d, g = rep["targets"]["direct"], rep["targets"]["gateway"]
        c = g["vs_baseline"]
        ttft = f"{c['ttft_p50_added_ms']:.2f} ms" if "ttft_p50_added_ms" in c else "-"
        cpu = (g.get("proxy_cpu") or {}).get("ms_per_req", float("nan"))
        lines.append(
            f"{rep['label']:<24} {d['latency_ms']['p50']:>8.2f}ms {g['latency_ms']['p50']:>6.2f}ms "
            f"{c['latency_p50_added_ms']:>7.2f}ms {c['latency_p99_added_ms']:>7.2f}ms "
            f"{c['latency_p50_ratio']:>6.3f} {c['rps_ratio']:>6.3f} {ttft:>10} {cpu:>13.2f} "
            f"{d['errors'] + g['errors']:>6}")
    lines.append("(stream rows: p50 = total stream time; 'ttft added' = first content chunk)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
