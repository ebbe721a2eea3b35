"""The installed wheel, as users run it: built, installed alone into a fresh venv, run from an
empty folder with nothing of the checkout on the path.

Slow (a wheel build and a venv: ~40 s warm, ~100 s with a cold wheelhouse), so marked `packaging` and run
by `make test-packaging` (.ci/run), not by `make test`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.chat import Conversation
from tests.support.emulator_proc import free_port
from tests.support.gateway_proc import wait_http
from tests.support.services import run_service
from tests.support.wheel import REPO, build_wheel, clean_env, install_wheel

pytestmark = pytest.mark.packaging

SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
GOLDEN = sorted((SHARED / "golden" / "dsv41").glob("*.json"))
# Like the demo lane dsv41-vllm of routes.yaml, so predicted and reported cached tokens agree.
EMULATOR_ARGS = ["--flavour", "vllm", "--model", "deepseek-v4-flash", "--tokenizer", "dsv41", "--default-thinking",
                 "--block-size", "16"]
RENDER = {"template": "deepseek_v4.1", "effort_map": {"low": 25, "high": 50, "xhigh": 75, "max": 100},
          "thinking": True, "drop_thinking": True, "carry": ["reasoning_effort", "chat_template_kwargs"]}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    return install_wheel(build_wheel(work), work / "venv")


@pytest.fixture
def user_dir(tmp_path) -> Path:
    """An empty folder, as a user's: the only files are the ones a test writes."""
    d = tmp_path / "deploy"
    d.mkdir()
    return d


def gateway(venv: Path, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run([str(venv / "gateway"), *args], cwd=cwd, env=clean_env(venv.parent), capture_output=True,
                         timeout=timeout)
    out.stdout_text = out.stdout.decode("utf-8")  # type: ignore[attr-defined]
    out.stderr_text = out.stderr.decode("utf-8")  # type: ignore[attr-defined]
    return out


def lane(url: str, **over) -> dict:
    base = {"engine": "vllm", "replicas": [url], "upstream_model": "deepseek-v4-flash", "render": dict(RENDER),
            "cache": {"block_size": 16}, "override": {"reason": "packaging test"}}
    return {**base, **over}


def test_the_installed_package_is_the_wheel_not_the_checkout(venv: Path, user_dir: Path) -> None:
    code = ("import gateway, gateway.render.template as t; print(gateway.__file__); "
            "print(t.template_path('deepseek_v4.1')); print(t.packaged_templates())")
    out = subprocess.run([str(venv / "python"), "-c", code], cwd=user_dir, env=clean_env(venv.parent),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    site = str(venv.parent / "lib")
    assert out[0].startswith(site) and out[1].startswith(site), out
    assert Path(out[1]).is_file() and "deepseek_v4.1" in out[2]


def test_emulate_takes_its_own_options_and_lists_them(venv: Path, user_dir: Path) -> None:
    out = gateway(venv, "emulate", "--help", cwd=user_dir)
    assert out.returncode == 0
    for flag in ("--host", "--port", "--flavour", "--block-size", "--tokenizer", "--config-json"):
        assert flag in out.stdout_text


def test_serve_from_an_empty_folder_chats_through_template_lanes(venv: Path, user_dir: Path) -> None:
    emu_port, gw_port = free_port(), free_port()
    emu_url, gw_url = f"http://127.0.0.1:{emu_port}", f"http://127.0.0.1:{gw_port}"
    (user_dir / "templates").mkdir()
    (user_dir / "templates" / "mine.jinja").write_text(
        (REPO / "gateway" / "chat_templates" / "deepseek_v4.1.jinja").read_text(encoding="utf-8"), encoding="utf-8")
    own = lane(emu_url)
    own["render"] = {**RENDER, "template": "templates/mine.jinja"}  # the lane's own file, relative to routes.yaml
    routes = {"lanes": {"packaged": lane(emu_url), "own": own},
              "models": {"deepseek-v4-flash": "packaged", "own-template": "own"}}
    (user_dir / "routes.yaml").write_text(yaml.safe_dump(routes, sort_keys=False), encoding="utf-8")
    assert gateway(venv, "check", "routes.yaml", cwd=user_dir).returncode == 0

    env = clean_env(venv.parent)
    with contextlib.ExitStack() as stack:
        emu = stack.enter_context(run_service("emulator", [str(venv / "gateway"), "emulate", "--port", str(emu_port),
                                                           *EMULATOR_ARGS],
                                              env=env, cwd=user_dir, log_dir=user_dir.parent))
        wait_http(emu_url + "/health", 30, emu.proc)
        probe = gateway(venv, "check", "--probe", "routes.yaml", cwd=user_dir)
        assert probe.returncode == 0 and "serves deepseek-v4-flash" in probe.stdout_text, probe.stderr_text
        gw = stack.enter_context(run_service("gateway", [str(venv / "gateway"), "serve", "--routes", "routes.yaml",
                                                         "--port", str(gw_port)], env=env, cwd=user_dir,
                                             log_dir=user_dir.parent))
        gw.url = gw_url
        wait_http(gw_url + "/healthz", 60, gw.proc)
        assert (user_dir / "var").is_dir()  # the default data directory, in the working folder

        for model in ("deepseek-v4-flash", "own-template"):
            chat = Conversation(model)
            verdicts = [chat.turn(gw) for _ in range(3)]
            assert [v["render"] for v in verdicts] == ["exact"] * 3, gw.log()[-2000:]
            assert all(v["render_matches_engine"] for v in verdicts), verdicts
            assert [v["verdict"] for v in verdicts[1:]] == ["hit", "hit"], verdicts
            # The engine held at least what the gateway predicted (hits, not evictions), to the block.
            assert all(v["reported_cached_tokens"] >= v["predicted_cached_tokens"] > 0 for v in verdicts[1:]), verdicts
        admin = httpx.get(gw_url + "/admin")  # the page's static files are package data too
        assert admin.status_code == 200 and "<html" in admin.text.lower()


def test_demo_runs_from_an_empty_folder_on_the_shipped_demo_lanes(venv: Path, user_dir: Path) -> None:
    """`gateway demo` after `pip install`: the demo routes and their qualification records ship in the wheel."""
    port = free_port()
    env = clean_env(venv.parent)
    with run_service("demo", [str(venv / "gateway"), "demo", "--port", str(port)], env=env, cwd=user_dir,
                     log_dir=user_dir.parent) as demo:
        wait_http(f"http://127.0.0.1:{port}/healthz", 90, demo.proc)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                       json={"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "Hi"}],
                             "max_tokens": 8})
        assert r.status_code == 200, (r.text, demo.log()[-2000:])
        assert "x-gateway-lane-override" not in r.headers  # qualified by the shipped records, not overridden


@pytest.mark.skipif(not GOLDEN, reason="no golden cases under shared/golden")
@pytest.mark.parametrize("name", ["06_effort_max", "10_agent_loop_tools", "16_non_ascii"])
def test_render_reproduces_golden_cases_exactly(venv: Path, user_dir: Path, name: str) -> None:
    case = json.loads((SHARED / "golden" / "dsv41" / f"{name}.json").read_text(encoding="utf-8"))
    # The golden prompts come from SGLang's reference encoder, with the template's own effort words.
    routes = {"lanes": {"reference": {"engine": "sglang", "replicas": ["http://127.0.0.1:9"],
                                      "upstream_model": "deepseek-v4-flash", "render": {"template": "deepseek_v4.1"},
                                      "override": {"reason": "render only"}}},
              "models": {"m": "reference"}}
    (user_dir / "routes.yaml").write_text(yaml.safe_dump(routes), encoding="utf-8")
    body = {"messages": case["messages"], "tools": case.get("tools"), "response_format": case.get("response_format"),
            "reasoning_effort": case["reasoning_effort"],
            "chat_template_kwargs": {"thinking": case["thinking"], "drop_thinking": case["drop_thinking"]}}
    (user_dir / "request.json").write_text(json.dumps(body, ensure_ascii=False), encoding="utf-8")
    out = gateway(venv, "render", "request.json", "--lane", "reference", cwd=user_dir)
    assert out.returncode == 0, out.stderr_text
    assert out.stdout_text == case["expected_prompt"]  # byte for byte: piped output carries nothing of ours
    summary = gateway(venv, "render", "request.json", "--lane", "reference", "--summary", cwd=user_dir)
    assert f"tokens {case['expected_token_count']} " in summary.stdout_text


def test_a_missing_template_is_refused_at_check_render_and_start(venv: Path, user_dir: Path) -> None:
    routes = {"lanes": {"a": lane("http://127.0.0.1:9", render={"template": "./nowhere.jinja"})}, "models": {"m": "a"}}
    (user_dir / "routes.yaml").write_text(yaml.safe_dump(routes, sort_keys=False), encoding="utf-8")
    (user_dir / "request.json").write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}))
    for args in (["check", "routes.yaml"], ["render", "request.json", "--lane", "a"],
                 ["serve", "--routes", "routes.yaml", "--port", str(free_port())]):
        out = gateway(venv, *args, cwd=user_dir, timeout=60)
        assert out.returncode == 2, (args, out.stdout_text, out.stderr_text)
        assert out.stdout_text.strip() == "" or args[0] == "check"
        lines = out.stderr_text.strip().splitlines()
        assert len(lines) == 1 and "routes.yaml:" in lines[0] and "lanes.a.render.template" in lines[0], lines
        assert "nowhere.jinja" in lines[0] and "Traceback" not in out.stderr_text
