"""The collector settings a gateway process takes once started (gateway/observe/gc_tuning.py)."""

from __future__ import annotations

import gc

import pytest

from gateway.observe import gc_tuning


@pytest.mark.parametrize("raw, expected", [
    ("", gc_tuning.THRESHOLDS),
    ("default", None),
    ("1000,5,5", (1000, 5, 5)),
    ("1000,5", gc_tuning.THRESHOLDS),  # malformed: warned about, the gateway's own choice stands
    ("0,5,5", gc_tuning.THRESHOLDS),
    ("a,b,c", gc_tuning.THRESHOLDS),
])
def test_thresholds_from_the_setting(raw, expected):  # GATEWAY_GC_THRESHOLDS (Settings.gc_thresholds)
    assert gc_tuning.thresholds(raw) == expected


def test_settle_freezes_what_start_up_made_and_sets_thresholds():
    before = gc.get_threshold()
    try:
        gc_tuning.settle()
        assert gc.get_freeze_count() > 1000
        assert gc.get_threshold() == gc_tuning.THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
