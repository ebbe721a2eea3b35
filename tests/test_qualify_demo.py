"""The quick start serves without overrides: the shipped records in qualifications/ cover the demo
lanes of routes.yaml exactly as they are configured."""

from __future__ import annotations

from pathlib import Path

from gateway.core.config import load_routes
from gateway.qualify.cli import lane_states
from gateway.qualify.records import DirStore

REPO = Path(__file__).resolve().parents[1]


def test_shipped_records_qualify_every_demo_lane(monkeypatch) -> None:
    monkeypatch.delenv("GATEWAY_QUALIFICATIONS", raising=False)
    config = load_routes(REPO / "routes.yaml")
    states = lane_states(config, REPO / "routes.yaml")
    demo = [name for name, lane in config.lanes.items() if lane.emulator is not None]
    assert demo
    for name in demo:
        state = states[name]
        assert state["state"] in ("qualified", "not_required"), (
            f"demo lane {name} would be refused by `gateway demo`: {state['reason']}. After changing a demo "
            "lane in routes.yaml, run `gateway qualify --demo` and commit qualifications/.")
        assert state["override"] is None, f"demo lane {name} carries an override it does not need"


def test_shipped_records_are_complete() -> None:
    for s in DirStore(REPO / "qualifications").summaries():
        rec = DirStore(REPO / "qualifications").load(s.id)
        assert rec["passed"] and rec["by"] and rec["at"]
        assert rec["determinism"]["status"] in ("baseline", "pass")
        assert set(rec["determinism"]["prompts"]) == {"short", "long", "tool_call", "multilingual"}
        assert rec["sink"]["status"] == "pass" and len(rec["sink"]["probes"]) == 10
        assert rec["performance"]["samples"]["A1"] and rec["performance"]["samples"]["A2"]
