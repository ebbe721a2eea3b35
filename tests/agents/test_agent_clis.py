"""Real agent CLIs and a Python agent framework (the OpenAI Agents SDK) against the gateway on the demo's
emulated lane (make test-agents): each runs one
headless tool-using session and must exit 0 with its answer printed, get only 2xx answers, form one
conversation for its session (title or summary calls may be their own), and have every turn's
predicted cached tokens equal what the engine reported (within one block).

The CLIs are installed, pinned, into tests/agents/node_modules by `make test-agents` (npm, from
tests/agents/package.json), the Agents SDK into the test venv (the `agents` extra); a client that is not
installed is reported as skipped, with why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.support.demo_lane import MODEL, demo_gateway
from tests.support.gateway_proc import REPO
from tests.support.poll import wait_until

pytestmark = pytest.mark.agents

BIN = Path(__file__).resolve().parent / "node_modules" / ".bin"
TASK = "List the files here, then say done."
BLOCK = 16


FIXTURES = Path(REPO) / "tests" / "fixtures" / "agents"


@pytest.fixture(scope="module")
def gw():
    g, managers = demo_gateway()
    try:
        yield g
    finally:
        for cm in managers:
            cm.__exit__(None, None, None)


def _seen(gw) -> set[str]:
    return {r["request_id"] for r in gw.emu.stats()["recent"]}


def _record(gw, before: set[str], name: str) -> None:
    """RECORD_AGENT_FIXTURES=1: keep the bodies the client's session sent (as the engine got them)."""
    if os.environ.get("RECORD_AGENT_FIXTURES") != "1":
        return
    sent = [{"path": r["path"], "body": r["body"]} for r in gw.emu.stats()["recent"] if r["request_id"] not in before]
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / f"{name}.json").write_text(json.dumps(sent, indent=1, ensure_ascii=False) + "\n")


def _run(argv: list[str], env: dict[str, str], files: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = BIN / argv[0]
    if not exe.exists():
        pytest.skip(f"{argv[0]} is not installed (make test-agents installs tests/agents/package.json with npm)")
    home = Path(tempfile.mkdtemp(prefix="agent-home-"))
    work = Path(tempfile.mkdtemp(prefix="agent-work-"))
    for name, text in (files or {}).items():
        path = (home if name.startswith("~/") else work) / name.removeprefix("~/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    full = {"PATH": os.environ["PATH"], "HOME": str(home), "IS_SANDBOX": "1", "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1", **env}
    return subprocess.run([str(exe), *argv[1:]], cwd=work, env=full, capture_output=True, text=True, timeout=300)


def _session(gw, agent: str, before: set[str]) -> list[dict]:
    """The records of this client's main session: its conversation with the most turns."""
    served = len(_seen(gw) - before)  # what reached the engine during the run: every one is recorded

    def rows() -> list[dict]:
        got = httpx.get(gw.url + "/admin/api/records", params={"limit": 200}).json()["records"]
        return [r for r in got if agent in (r.get("user_agent") or "").lower()]

    wait_until(lambda: len(rows()) >= served and all(r.get("verdict") for r in rows()),
               what=f"{agent}'s turns recorded and analysed")
    mine = rows()
    assert all(200 <= r["status"] < 300 for r in mine), [(r["path"], r["status"], r["error_code"]) for r in mine]
    by_conversation: dict[str, list[dict]] = {}
    for r in mine:
        by_conversation.setdefault(r["conversation"], []).append(r)
    session = max(by_conversation.values(), key=len)
    assert len(session) >= 2, "a tool-using session has at least two turns"
    assert sorted(r["turn"] for r in session) == list(range(1, len(session) + 1))
    return sorted(session, key=lambda r: r["turn"])


def _predicted_right(session: list[dict]) -> None:
    for r in session:
        assert r["cached_tokens"] is not None and abs(r["predicted_cached_tokens"] - r["cached_tokens"]) <= BLOCK, r
        assert r["verdict"] in ("hit", "cold"), r


def test_qwen_code_chat_completions(gw) -> None:
    before = _seen(gw)
    out = _run(["qwen", "-p", TASK, "--yolo"], {"OPENAI_BASE_URL": gw.url + "/v1", "OPENAI_API_KEY": "demo",
                                                 "OPENAI_MODEL": MODEL})
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    _record(gw, before, "qwen-code")
    _predicted_right(_session(gw, "qwencode", before))


def test_claude_code_anthropic_messages(gw) -> None:
    before = _seen(gw)
    out = _run(["claude", "-p", TASK, "--dangerously-skip-permissions"],
               {"ANTHROPIC_BASE_URL": gw.url, "ANTHROPIC_AUTH_TOKEN": "demo", "ANTHROPIC_MODEL": MODEL,
                "ANTHROPIC_SMALL_FAST_MODEL": MODEL})
    assert out.returncode == 0 and out.stdout.strip(), out.stdout[-2000:] + out.stderr[-2000:]
    _record(gw, before, "claude-code")
    _predicted_right(_session(gw, "claude-cli", before))


def test_opencode_ai_sdk_openai_compatible(gw) -> None:
    config = {"$schema": "https://opencode.ai/config.json", "model": f"lane/{MODEL}",
              "provider": {"lane": {"npm": "@ai-sdk/openai-compatible", "name": "lane-gateway",
                                    "options": {"baseURL": gw.url + "/v1", "apiKey": "demo"},
                                    "models": {MODEL: {"name": MODEL}}}}}
    before = _seen(gw)
    out = _run(["opencode", "run", TASK], {}, {"opencode.json": json.dumps(config)})
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    _record(gw, before, "opencode")
    _predicted_right(_session(gw, "opencode", before))


def test_codex_responses_api(gw) -> None:
    config = (f'model = "{MODEL}"\nmodel_provider = "lane"\n\n[model_providers.lane]\nname = "lane-gateway"\n'
              f'base_url = "{gw.url}/v1"\nwire_api = "responses"\nenv_key = "LANE_API_KEY"\n')
    before = _seen(gw)
    out = _run(["codex", "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", TASK],
               {"LANE_API_KEY": "demo"}, {"~/.codex/config.toml": config})
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    _record(gw, before, "codex")
    _predicted_right(_session(gw, "codex", before))


def test_openai_agents_sdk_chat_completions(gw) -> None:
    try:
        import agents  # noqa: F401
    except ImportError:
        pytest.skip("openai-agents is not installed (make test-agents installs the `agents` extra)")
    before = _seen(gw)
    script = Path(__file__).resolve().parent / "agents_sdk_session.py"
    env = {**os.environ, "OPENAI_BASE_URL": gw.url + "/v1", "MODEL": MODEL}
    out = subprocess.run([sys.executable, str(script)], cwd=tempfile.mkdtemp(prefix="agent-work-"), env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    _record(gw, before, "openai-agents")
    _predicted_right(_session(gw, "agents/python", before))  # the SDK's User-Agent: Agents/Python 0.24.0
