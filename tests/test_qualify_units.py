"""Qualification pieces without a network: verdict statistics, lane identity, state and reasons,
record stores (directory, Redis), and the CLI's status views."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gateway.core.config import parse_routes
from gateway.qualify.determinism import text_diff
from gateway.qualify.identity import lane_identity
from gateway.qualify.records import DirStore, RecordIndex, open_store
from gateway.qualify.state import evaluate
from gateway.qualify.stats import judge
from gateway.qualify.suite import DETERMINISM_SUITE, parse_shapes, suite_id

ROUTES = """
lanes:
  a:
    engine: vllm
    replicas: ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    upstream_model: deepseek-v4-flash
    limits: {max_images: 4}
    timeouts: {first_byte: 30}
models: {m: a}
"""


def lane(text: str = ROUTES, **patch):
    import yaml

    data = yaml.safe_load(text)
    data["lanes"]["a"].update(patch)
    return parse_routes(json.dumps(data)).lanes["a"]


def record_for(lane_cfg, *, name: str = "a", passed: bool = True, at: float | None = None,
               revision: str | None = None, failures=()) -> dict:
    ident = lane_identity(lane_cfg, revision)
    t = at if at is not None else time.time()
    return {"schema": 1, "lane": name, "passed": passed, "failures": list(failures), "identity": ident.fields,
            "identity_hash": ident.hash, "config_hash": ident.config_hash, "by": "t@h", "at_unix": t,
            "at": "x", "determinism": {}, "sink": {}, "performance": {}}


# -- statistics -------------------------------------------------------------------------------------


def test_a_difference_within_the_candidates_own_drift_is_same_never_better() -> None:
    a1 = [100.0, 101, 99, 100, 100]
    a2 = [120.0, 121, 119, 120, 120]  # the candidate moved by 20 between its own runs
    b = [95.0, 96, 94, 95, 95]  # 15 below the candidate's mean: clearly outside the interval, inside the drift
    v = judge("x", a1, a2, b, higher_is_better=True, min_effect=0.0)
    assert v.ci95[0] > 0  # the interval alone would say "better"
    assert v.verdict == "same" and "drift" in v.why


def test_a_clear_difference_beyond_drift_is_better_or_worse_by_direction() -> None:
    a1 = [200.0, 201, 199, 200]
    a2 = [200.0, 199, 201, 200]
    b = [100.0, 101, 99, 100]
    assert judge("tps", a1, a2, b, higher_is_better=True).verdict == "better"
    assert judge("ttft", a1, a2, b, higher_is_better=False).verdict == "worse"
    assert judge("tps", b, b, a1, higher_is_better=True).verdict == "worse"


def test_an_interval_containing_zero_is_same_and_tiny_effects_are_same() -> None:
    a = [100.0, 110, 90, 105, 95]
    assert judge("x", a, a, [101.0, 108, 92, 104, 96], higher_is_better=True).verdict == "same"
    # Perfectly stable lanes 1% apart: the interval excludes 0 but 1% is below the 3% minimum effect.
    v = judge("x", [101.0] * 4, [101.0] * 4, [100.0] * 4, higher_is_better=True)
    assert v.verdict == "same" and "minimum effect" in v.why
    assert judge("x", [101.0] * 4, [101.0] * 4, [100.0] * 4, higher_is_better=True, min_effect=0.0).verdict == "better"


def test_latency_medians_ignore_a_scheduling_hiccup() -> None:
    a = [10.0, 10.2, 9.9, 10.1, 10.0]
    b = [10.0, 10.1, 9.9, 10.2, 400.0]
    assert judge("ttft", a, a, b, higher_is_better=False, stat="median", abs_floor=5).verdict == "same"


def test_shapes_parse_and_reject_nonsense() -> None:
    names = [s.name for s in parse_shapes("decode@2k, decode@32k,throughput@4,decode@1500")]
    assert names == ["decode@2k", "decode@32k", "throughput@4", "decode@1500"]
    for bad in ("decode", "throughput@2k", "prefill@2k", "decode@0", ""):
        with pytest.raises(ValueError):
            parse_shapes(bad)


def test_suite_is_stable_and_covers_the_four_kinds() -> None:
    assert [p.name for p in DETERMINISM_SUITE] == ["short", "long", "tool_call", "multilingual"]
    assert suite_id(64, 1234) == suite_id(64, 1234) != suite_id(64, 1235) != suite_id(32, 1234)
    long_text = DETERMINISM_SUITE[1].messages[1]["content"]
    assert 1800 < len(long_text.split()) < 2300


def test_text_diff_points_at_the_first_difference() -> None:
    d = text_diff("the quick brown fox", "the quick red fox", "short")
    assert d.startswith("first difference at character 10")
    assert "-brown" in d and "+red" in d


# -- identity -----------------------------------------------------------------------------------------


def test_identity_covers_what_the_lane_is_and_not_gateway_side_settings() -> None:
    base = lane_identity(lane())
    assert lane_identity(lane(timeouts={"first_byte": 99}, routing="round_robin")).hash == base.hash
    assert lane_identity(lane(replicas=["http://127.0.0.1:9002", "http://127.0.0.1:9001"])).hash == base.hash
    for patch in ({"replicas": ["http://127.0.0.1:9001"]}, {"limits": {"max_images": 2}}, {"engine": "sglang"},
                  {"upstream_model": "other"}, {"render": {"template": None}},
                  {"emulator": {"knobs": {"output_salt": "x"}}}):
        assert lane_identity(lane(**patch)).hash != base.hash, patch
    assert base.config_hash == base.with_revision("r1").config_hash and base.hash != base.with_revision("r1").hash
    assert lane_identity(lane(revision="pinned"), "reported").revision == "pinned"


# -- state --------------------------------------------------------------------------------------------


def test_states_and_their_reasons(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    cfg = lane()
    index = lambda: RecordIndex(store.summaries())  # noqa: E731
    s = evaluate("a", cfg, index())
    assert (s["state"] == "unqualified" and "no qualification record" in s["reason"]
            and "gateway qualify a" in s["reason"])
    assert evaluate("a", lane(qualification="not_required"), index())["state"] == "not_required"

    store.save(record_for(cfg, passed=False, failures=["sink probe: 'Hey' empty"]))
    s = evaluate("a", cfg, index())
    assert s["state"] == "unqualified" and "failed (sink probe" in s["reason"]
    assert s["latest_run"]["passed"] is False

    ok_id = store.save(record_for(cfg, revision="rev1", at=time.time() + 1))
    s = evaluate("a", cfg, index(), "rev1")
    assert s["state"] == "qualified" and s["record"] == ok_id and s["override"] is None
    assert evaluate("a", cfg, index(), "rev2")["reason"].startswith("the upstream revision changed")

    changed = lane(limits={"max_images": 1})
    s = evaluate("a", changed, index())
    assert s["state"] == "unqualified" and "(limits differ)" in s["reason"]
    s = evaluate("a", lane(limits={"max_images": 1}, override={"reason": "INC-7"}), index())
    assert s["state"] == "overridden" and s["override"] == "INC-7" and "limits differ" in s["reason"]
    # A passing record covers the identity whatever the lane is called.
    assert evaluate("renamed", cfg, index(), "rev1")["state"] == "qualified"


def test_a_broken_record_file_qualifies_nothing(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.json").write_text("{not json")
    assert DirStore(tmp_path).summaries() == []


def test_directory_store_signature_changes_on_save(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    before = store.signature()
    rid = store.save(record_for(lane()))
    assert store.signature() != before
    assert store.load(rid)["id"] == rid
    assert store.load("../../etc/passwd") is None


def test_redis_store_layers_over_the_shipped_directory(tmp_path: Path, redis_url: str) -> None:
    shipped = DirStore(tmp_path / "qualifications")
    cfg = lane()
    other = lane(replicas=["http://127.0.0.1:9009"])
    shipped_id = shipped.save(record_for(cfg))
    store = open_store(tmp_path / "routes.yaml", None, redis_url)
    sig = store.signature()
    new_id = store.save(record_for(other))
    assert store.signature() != sig
    assert not (tmp_path / "qualifications" / (new_id + ".json")).exists()  # written to Redis
    index = RecordIndex(store.summaries())
    assert index.passing_for(lane_identity(cfg)).id == shipped_id
    assert index.passing_for(lane_identity(other)).id == new_id
    assert store.load(new_id)["lane"] == "a"


# -- CLI views ------------------------------------------------------------------------------------------


def test_status_and_check_report_the_state(tmp_path: Path, capsys) -> None:
    from gateway.cli.main import main

    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    assert main(["qualify", "--status", "--routes", str(routes)]) == 1
    out = capsys.readouterr().out
    assert "unqualified" in out and "gateway qualify a" in out
    assert main(["check", str(routes)]) == 1  # a lane that would be refused fails the check (a deploy gate)
    captured = capsys.readouterr()
    assert "qualification:" in captured.out and "a: unqualified [REFUSED]" in captured.out
    assert "routes.yaml:" in captured.err and "lanes.a" in captured.err and "would be refused" in captured.err

    DirStore(tmp_path / "qualifications").save(record_for(lane()))
    assert main(["qualify", "--status", "--routes", str(routes), "--json"]) == 0
    states = json.loads(capsys.readouterr().out)
    assert states["a"]["state"] == "qualified"
    routes.write_text(ROUTES.replace("limits: {max_images: 4}",
                                     "limits: {max_images: 4}\n    override: {reason: demo}"))
    main(["check", str(routes)])
    out = capsys.readouterr().out
    assert "a: qualified [ok]" in out and "not needed: demo" in out  # a record makes the override unnecessary


def test_the_shipped_qualification_records_name_a_role_not_a_person_or_machine():
    shipped = sorted((Path(__file__).resolve().parents[1] / "qualifications").glob("*/*.json"))
    assert shipped
    for path in shipped:
        by = json.loads(path.read_text())["by"]
        assert by and "@" not in by, f"{path.name}: {by!r}"
