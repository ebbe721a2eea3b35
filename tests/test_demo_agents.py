"""The demo's lanes play an agent's model: an agent CLI's session (max_tokens 64000, a shell tool) runs
against them as it comes, calls its shell tool twice per task, gets answers that end like a model's,
and stays one conversation whose every turn is predicted exactly."""

from __future__ import annotations

from pathlib import Path

from gateway.cli.main import DEMO_AGENT_TOOL_TURNS, emulator_knobs
from gateway.core.config import load_routes
from tests.support.conversations import Agent
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import REPO, run_gateway
from tests.support.routes import agent_routes

SHELL = [{"type": "function", "function": {
    "name": "run_shell_command", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def test_an_agent_session_runs_on_the_demo_lane_as_it_comes() -> None:
    demo = load_routes(Path(REPO) / "routes.yaml").lanes["dsv41-vllm"]
    knobs = emulator_knobs(demo, None)
    assert knobs["max_model_len"] >= 1 << 20
    with run_emulator(**knobs) as emu, \
            run_gateway(agent_routes(emu.url, limits={"max_context_tokens": 1 << 20})) as gw:
        agent = Agent(gw, max_tokens=64000)  # what Qwen Code asks
        agent.tools = SHELL
        caches = agent.cold_then_hits(2 * (DEMO_AGENT_TOOL_TURNS + 1) - 1)
        said = [m for m in agent.messages if m["role"] == "assistant"]
        pattern = ["tool" if m.get("tool_calls") else "answer" for m in said]
        assert pattern == (["tool"] * DEMO_AGENT_TOOL_TURNS + ["answer"]) * 2, pattern
        assert all('"command": "echo ok"' in m["tool_calls"][0]["function"]["arguments"]
                   for m in said if m.get("tool_calls"))
        answers = [m["content"] for m in said if not m.get("tool_calls")]
        assert all(0 < len(a.split()) < 1000 for a in answers)  # a model's answer, not 64,000 words
        assert len({c["conversation"] for c in caches if c.get("conversation")} | {agent.cid}) == 1
