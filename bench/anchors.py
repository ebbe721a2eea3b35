#!/usr/bin/env python3
"""The gateway beside nginx, vllm-router (Rust) and the Starlette+aiohttp floor, in one run per scenario.

The measurement: ../shared/perf's run_anchors.py drives ../shared/tools/loadgen.py in paired
rounds against direct access to the shared stub upstream, every target in the same run
(`--together`), and make_report.py prints the tables. The gateway runs a realistic lane: the
DeepSeek-V4.1 template, limits, effort pinning, conversation analysis (its worker process is counted:
CPU is taken over the gateway's whole process tree) and SQLite records.

    ../shared/perf/setup.sh                          # once: venvs, vllm-router, nginx
    python bench/anchors.py                          # chat_c1, chat_c32, stream_c1, large_c4
    python bench/anchors.py --workers 2 --scenarios chat_c32
    GATEWAY_WIRE=0 python bench/anchors.py           # the same through the ASGI path, for comparison

Starts the anchors with ../shared/perf/services.sh (and leaves running what was already running).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
PERF = SHARED / "perf"
WORK = Path(os.environ.get("PERF_WORK", Path.home() / ".cache" / "gateway-perf"))
STUB = "http://127.0.0.1:18000"

from tests.support.gateway_proc import free_port, wait_http  # noqa: E402


def routes() -> dict:
    def lane(model: str) -> dict:
        return {"engine": "vllm", "replicas": [STUB], "upstream_model": model, "qualification": "not_required",
                "render": {"template": "deepseek_v4.1"}, "limits": {"max_context_tokens": 1_048_576}}

    return {"gateway": {"max_request_bytes": 64 * 1024 * 1024},
            "lanes": {"mock": lane("mock-model"), "paced": lane("mock-model-itl2")},
            "models": {"mock-model": "mock", "mock-model-itl2": "paced"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="chat_c1,chat_c32,stream_c1,large_c4")
    ap.add_argument("--anchors", default="nginx,vllmr,refaiohttp")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--out", default=None, help="results directory (default: a new one under $PERF_WORK)")
    a = ap.parse_args()

    python = WORK / ".venv-tools" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run {PERF / 'setup.sh'} first")
    services = {"nginx": "nginx", "vllmr": "vllmr", "refaiohttp": "refaiohttp"}
    wanted = ["mock", *[services[x] for x in a.anchors.split(",") if x in services]]
    subprocess.run([str(PERF / "services.sh"), "start", *wanted], check=True, stdout=subprocess.DEVNULL)
    wait_http(STUB + "/v1/models", 20)

    tmp = Path(tempfile.mkdtemp(prefix="gw-anchors-"))
    (tmp / "routes.yaml").write_text(yaml.safe_dump(routes()))
    port = free_port()
    env = dict(os.environ, GATEWAY_LOG_LEVEL="warning", GATEWAY_ACCESS_LOG_FILE=str(tmp / "access.log"))
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--routes", str(tmp / "routes.yaml"), "--port", str(port),
           "--data-dir", str(tmp / "data"), "--workers", str(a.workers)]
    with open(tmp / "gateway.log", "wb") as log:
        gw = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    out = Path(a.out) if a.out else WORK / f"results-gw-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", 60, gw)
        time.sleep(2)  # the analysis worker loads tokenizers and templates
        rc = subprocess.run([str(python), str(PERF / "run_anchors.py"), "--anchors", a.anchors,
                             "--target", f"gw=http://127.0.0.1:{port}", "--pid", f"gw={gw.pid}", "--together",
                             "--trials", str(a.trials), "--scenarios", a.scenarios, "--out", str(out)]).returncode
    finally:
        gw.terminate()
        gw.wait(30)
    subprocess.run([str(python), str(PERF / "make_report.py"), str(out)])
    print(f"\nresults: {out}; gateway log: {tmp / 'gateway.log'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
