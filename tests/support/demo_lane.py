"""The gateway on the demo's lane, as `gateway demo` runs it (the lane's emulator knobs: an agent's
model, DeepSeek V4's 1M window), on free ports: for the agent CLIs and their recorded sessions."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cli.main import emulator_knobs
from gateway.core.config import load_routes
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import REPO, run_gateway

MODEL = "deepseek-v4-flash"


def demo_gateway():
    """The gateway on the demo's lane (its emulator knobs: an agent's model, a 1M window), on free ports."""
    demo = load_routes(Path(REPO) / "routes.yaml").lanes["dsv41-vllm"]
    emu_cm = run_emulator(**emulator_knobs(demo, None), recent_requests=200)
    emu = emu_cm.__enter__()
    lane = json.loads(demo.model_dump_json(exclude={"emulator"}, exclude_none=True))
    lane.update(replicas=[emu.url], qualification="not_required")
    gw_cm = run_gateway({"lanes": {"ds": lane}, "models": {MODEL: "ds"}})
    g = gw_cm.__enter__()
    g.emu = emu  # type: ignore[attr-defined]
    return g, (gw_cm, emu_cm)
