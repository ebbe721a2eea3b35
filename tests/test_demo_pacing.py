"""`gateway demo` paces its emulated lanes like a real one by default; the tests' emulator is not paced."""

from __future__ import annotations

from gateway.cli.main import DEMO_DECODE_TPS, DEMO_PREFILL_TPS, build_parser, emulator_knobs
from gateway.core.config import load_routes
from gateway.emulator.config import EmulatorConfig


def _demo_lane():
    config = load_routes("routes.yaml")
    return next(lane for lane in config.lanes.values() if lane.emulator is not None)


def test_demo_defaults_are_paced():
    args = build_parser().parse_args(["demo"])
    assert (args.decode_tps, args.prefill_tps, args.no_pacing) == (DEMO_DECODE_TPS, DEMO_PREFILL_TPS, False)
    knobs = emulator_knobs(_demo_lane(), (args.decode_tps, args.prefill_tps))
    assert knobs["decode_tps"] == 60 and knobs["prefill_tps"] == 5000
    EmulatorConfig().merged(knobs).validate()  # the emulator takes them


def test_no_pacing_and_lane_knobs_win():
    args = build_parser().parse_args(["demo", "--no-pacing"])
    assert args.no_pacing
    assert "decode_tps" not in emulator_knobs(_demo_lane(), None)
    lane = _demo_lane().model_copy(update={"emulator": _demo_lane().emulator.model_copy(
        update={"knobs": {"decode_tps": 500}})})
    assert emulator_knobs(lane, (60, 5000))["decode_tps"] == 500


def test_the_tests_emulator_is_not_paced():
    assert EmulatorConfig().decode_tps == 0 and EmulatorConfig().prefill_tps == 0
