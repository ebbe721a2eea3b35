"""The template on a real engine: vLLM's CPU build (shared/engine) started with
`--chat-template gateway/chat_templates/deepseek_v4.1.jinja`, compared through its /tokenize endpoint.

Run alone: `pytest -m engine tests/test_render_engine.py` (starts the engine, 60-120 s), or point
RENDER_ENGINE_URL at an engine already serving this template. The unit tests of the vLLM request
normalisation at the bottom run everywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateway.render import Renderer, RenderOptions, SegmentCache
from gateway.render.engines import normalize_messages, normalize_tools
from tests.support.poll import wait_until
from tests.support.random_requests import random_request

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
GOLDEN = SHARED / "golden"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine_url():
    url = os.environ.get("RENDER_ENGINE_URL")
    if url:
        yield url.rstrip("/")
        return
    serve = SHARED / "engine" / "serve.sh"
    home = Path(os.environ.get("ENGINE_HOME", Path.home() / ".cache" / "gateway-engine"))
    if not serve.exists() or not (home / "venv").exists():
        pytest.skip("vLLM CPU engine not installed (shared/engine/install.sh)")
    port = _free_port()
    log = open(f"/tmp/render-engine-{port}.log", "w")
    template = REPO / "gateway" / "chat_templates" / "deepseek_v4.1.jinja"
    proc = subprocess.Popen([str(serve), str(port), "--chat-template", str(template)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def answers() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"engine exited, see {log.name}")
            urllib.request.urlopen(url + "/v1/models", timeout=2)  # noqa: S310 - loopback
            return True

        wait_until(answers, 300, f"the engine to start (see {log.name})", interval=2, ignore=(Exception,))
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _engine_tokens(url: str, body: dict, opts: RenderOptions):
    kw = {"thinking": opts.thinking, "drop_thinking": opts.drop_thinking}
    if opts.reasoning_effort is not None:
        kw["reasoning_effort"] = opts.reasoning_effort
    if body.get("response_format"):
        kw["response_format"] = body["response_format"]
    msgs = []
    for m in body["messages"]:
        m = dict(m)
        if "reasoning_content" in m:  # the chat endpoint renames it to `reasoning`; /tokenize does not
            m["reasoning"] = m.pop("reasoning_content")
        if m.get("tool_calls"):
            tcs = []
            for tc in m["tool_calls"]:
                fn = dict(tc["function"])
                if not isinstance(fn["arguments"], str):
                    fn["arguments"] = json.dumps(fn["arguments"])
                tcs.append({"id": "", **tc, "function": fn})
            m["tool_calls"] = tcs
        msgs.append(m)
    req = {"model": "deepseek-v4-tiny", "messages": msgs, "add_generation_prompt": True, "chat_template_kwargs": kw}
    if body.get("tools") is not None:
        req["tools"] = body["tools"]
    r = urllib.request.Request(url + "/tokenize", data=json.dumps(req).encode(),
                               headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=60) as resp:
            return json.load(resp)["tokens"]
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"


def _vllm_body(body: dict) -> dict:
    """vLLM's template sees response_format only through chat_template_kwargs (as _engine_tokens sends it)."""
    rf = body.get("response_format")
    return {**body, "chat_template_kwargs": {"response_format": rf}} if rf else body


def _has_image(body: dict) -> bool:
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                          for p in m["content"]) for m in body["messages"])


@pytest.mark.engine
def test_golden_on_vllm(engine_url):
    r = Renderer(RenderOptions(), cache=SegmentCache())
    checked = 0
    for path in sorted((GOLDEN / "dsv41").glob("*.json")) + sorted((GOLDEN / "dsv41_turns").glob("*.json")):
        d = json.loads(path.read_text())
        reqs = [d] if "expected_prompt" in d else [d["turn1"], d["turn2"]]
        for q in reqs:
            body = {"messages": q["messages"], "tools": q.get("tools"), "response_format": q.get("response_format")}
            if _has_image(body):
                continue  # the tiny test model is not multimodal
            opts = RenderOptions(thinking=q["thinking"], reasoning_effort=q["reasoning_effort"],
                                 drop_thinking=q["drop_thinking"], engine="vllm")
            assert _engine_tokens(engine_url, body, opts) == r.render(_vllm_body(body), opts).token_ids, path.name
            checked += 1
    assert checked >= 45


@pytest.mark.engine
def test_random_requests_on_vllm(engine_url):
    r = Renderer(RenderOptions(), cache=SegmentCache())
    compared = 0
    for seed in range(400):
        body, o = random_request(random.Random(seed))
        if _has_image(body):
            continue
        opts = RenderOptions(thinking=o.thinking, reasoning_effort=o.reasoning_effort,
                             drop_thinking=o.drop_thinking, engine="vllm")
        got = _engine_tokens(engine_url, body, opts)
        if got == "HTTP 400":  # vLLM's request schema is stricter (e.g. tool_call_id required)
            continue
        assert got == r.render(_vllm_body(body), opts).token_ids, seed
        compared += 1
    assert compared > 100


# -- vLLM request normalisation (no engine needed) -----------------------------------------------


def test_vllm_joins_text_only_tool_parts_with_newline():
    case = json.loads((GOLDEN / "dsv41" / "21_tool_content_as_text_parts.json").read_text())
    body = {"messages": case["messages"], "tools": case["tools"]}
    r = Renderer(RenderOptions(), cache=SegmentCache())
    sg = r.render(body, RenderOptions(thinking=True, reasoning_effort="xhigh"))
    vl = r.render(body, RenderOptions(thinking=True, reasoning_effort="xhigh", engine="vllm"))
    assert sg.prompt == case["expected_prompt"]
    assert sg.prompt.replace("0.0021\n\n14:05", "0.0021\n14:05") == vl.prompt
    assert r.render_template(body, RenderOptions(thinking=True, reasoning_effort="xhigh", engine="vllm")) == vl.prompt


def test_vllm_tool_and_system_normalisation():
    tools = [{"type": "function", "function": {"parameters": {"type": "object"}, "name": "f", "x-extra": 1}}]
    assert normalize_tools("vllm", tools) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}]
    assert normalize_tools("sglang", tools) is tools
    msgs = [{"role": "system", "content": "x-anthropic-billing-header: cch=1\nYou are Claude Code."},
            {"role": "tool", "content": [{"type": "text", "text": "a"},
                                         {"type": "image_url", "image_url": {"url": "u"}}]}]
    out = normalize_messages("vllm", msgs)
    assert out[0]["content"] == "You are Claude Code."
    assert out[1] is msgs[1]  # mixed content stays a list
    assert normalize_messages("sglang", msgs) is msgs
