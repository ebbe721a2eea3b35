#!/usr/bin/env python3
"""The anchors' large_c4 scenario for gateways only, in one paired loadgen run (quick A/B).

Several gateways side by side (each a checkout of this repository, optionally with environment
settings), against the shared stub upstream on :18000 and direct access to it, in paired rounds
(../shared/tools/loadgen.py, ~2 MB bodies of 1,600 messages at concurrency 4), each gateway's CPU
counted over its process tree (its analysis worker too). bench/anchors.py is the full measurement
(beside nginx, vllm-router and the aiohttp floor); this one compares versions of the gateway:

    python bench/large_c4.py                                   # this checkout
    python bench/large_c4.py --gateway main=/work/main --gateway this=.
    python bench/large_c4.py --gateway ring=. --gateway noring=.:GATEWAY_ANALYSIS_RING_MB=0

Needs ../shared/perf/setup.sh (the tools venv); starts the stub with ../shared/perf/services.sh if
it is not running.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from anchors import PERF, SHARED, STUB, WORK, routes  # noqa: E402
from tests.support.gateway_proc import free_port, wait_http  # noqa: E402

import yaml  # noqa: E402


def _start(stack: ExitStack, name: str, spec: str) -> tuple[str, int]:
    where, _, env_spec = spec.partition(":")
    checkout = Path(where).resolve()
    env = dict(os.environ, GATEWAY_LOG_LEVEL="warning")
    for item in filter(None, env_spec.split(",")):
        key, _, value = item.partition("=")
        env[key] = value
    tmp = Path(tempfile.mkdtemp(prefix=f"gw-large-{name}-"))
    (tmp / "routes.yaml").write_text(yaml.safe_dump(routes()))
    env["GATEWAY_ACCESS_LOG_FILE"] = str(tmp / "access.log")
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--routes", str(tmp / "routes.yaml"), "--port", str(port),
           "--data-dir", str(tmp / "data")]
    log = open(tmp / "gateway.log", "wb")
    stack.callback(log.close)
    # `python -m` puts the working directory first on sys.path: the checkout's own gateway package.
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.terminate()
        proc.wait(30)
    stack.callback(stop)
    wait_http(f"http://127.0.0.1:{port}/healthz", 60, proc)
    print(f"{name}: {checkout} {env_spec or ''} on :{port}, log {tmp / 'gateway.log'}", file=sys.stderr)
    return f"{name}=http://127.0.0.1:{port}", proc.pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", action="append", metavar="NAME=DIR[:ENV=VALUE,...]")
    ap.add_argument("--requests", type=int, default=480)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    python = WORK / ".venv-tools" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run {PERF / 'setup.sh'} first")
    subprocess.run([str(PERF / "services.sh"), "start", "mock"], check=True, stdout=subprocess.DEVNULL)
    wait_http(STUB + "/v1/models", 20)
    specs = a.gateway or [f"gw={REPO}"]
    with ExitStack() as stack:
        targets, procs = [f"direct={STUB}"], []
        for spec in specs:
            name, _, rest = spec.partition("=")
            target, pid = _start(stack, name, rest)
            targets.append(target)
            procs.append(f"{name}={pid}")
        time.sleep(2)  # the analysis workers load tokenizers and templates
        out = a.json_out or str(Path(tempfile.mkdtemp(prefix="gw-large-c4-")) / "report.json")
        cmd = [str(python), str(SHARED / "tools" / "loadgen.py"), "--mode", "chat", "-c", str(a.concurrency),
               "--body-bytes", "2000000", "--messages", "1600", "--requests", str(a.requests),
               "--rounds", str(a.rounds), "--warmup", "16", "--json-out", out]
        for t in targets:
            cmd += ["--target", t]
        for p in procs:
            cmd += ["--proc", p]
        rc = subprocess.run(cmd).returncode
    report = json.loads(Path(out).read_text())
    print(f"\nreport: {out}")
    return rc if report else 1


if __name__ == "__main__":
    sys.exit(main())
