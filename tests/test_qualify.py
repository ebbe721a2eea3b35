"""Lane qualification against the emulator: determinism gate, sink probe, A/B/A verdicts, and the
gateway's refusal of unqualified lanes (through the real gateway process)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


from gateway.core.config import parse_routes
from gateway.qualify.client import InProcessLane
from gateway.qualify.identity import lane_identity
from gateway.qualify.perf import PerfOptions
from gateway.qualify.records import DirStore, RecordIndex
from gateway.qualify.runner import Baseline, QualifyOptions, qualify
from gateway.qualify.suite import parse_shapes
from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until

MODEL = "deepseek-v4-flash"


def lane_cfg(url: str, **extra: Any):
    routes = {"lanes": {"cand": {"engine": "vllm", "replicas": [url], "upstream_model": MODEL, **extra}},
              "models": {"m": "cand"}}
    return parse_routes(json.dumps(routes)).lanes["cand"]


def run_qualify(url: str, store: DirStore, *, perf: PerfOptions | None = None, baseline_url: str | None = None,
                name: str = "cand", save: bool = True, **opts: Any) -> dict[str, Any]:
    """One qualification run in-process, as `gateway qualify` does it (small token budgets)."""
    lane = lane_cfg(url)

    async def go() -> dict[str, Any]:
        cand = InProcessLane(name, lane)
        base = InProcessLane("base", lane_cfg(baseline_url)) if baseline_url else None
        try:
            s = RecordIndex(store.summaries()).latest_passing_for_lane(name)
            previous = store.load(s.id) if s else None
            baseline = Baseline("lane", "lane base", client=base) if base else None
            o = QualifyOptions(determinism_tokens=12, probe_tokens=8, perf=perf, by="tester@test", **opts)
            return await qualify(name, cand, lane_identity(lane), "vllm", previous=previous, baseline=baseline,
                                 opts=o)
        finally:
            await cand.close()
            if base:
                await base.close()

    record = asyncio.run(go())
    if save:
        record["id"] = store.save(record)
    return record


# -- determinism ------------------------------------------------------------------------------------


def test_deterministic_emulator_passes_and_records_then_matches(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    with run_emulator(flavour="vllm", model=MODEL) as emu:
        first = run_qualify(emu.url, store)
        assert first["passed"], first["failures"]
        assert first["determinism"]["status"] == "baseline"
        assert set(first["determinism"]["prompts"]) == {"short", "long", "tool_call", "multilingual"}
        assert all(p["repeat_equal"] for p in first["determinism"]["prompts"].values())
        assert first["determinism"]["prompts"]["long"]["prompt_tokens"] > 1500  # the ~2K-token prompt
        assert first["determinism"]["prompts"]["tool_call"]["finish_reason"] == "tool_calls"
        assert first["sink"]["status"] == "pass"
        assert first["identity"]["revision"]  # the replica's model root
        saved = json.loads((tmp_path / "q" / (first["id"] + ".json")).read_text())
        assert saved["by"] == "tester@test" and saved["passed"]

        second = run_qualify(emu.url, store)
        assert second["passed"], second["failures"]
        assert second["determinism"]["status"] == "pass"
        assert second["determinism"]["compared_to"] == first["id"]


def test_changed_output_fails_the_determinism_gate_naming_the_prompts(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    with run_emulator(flavour="vllm", model=MODEL) as emu:
        base = run_qualify(emu.url, store)
        assert base["passed"]
        emu.configure(output_salt="new-engine-build")
        rec = run_qualify(emu.url, store)
    det = rec["determinism"]
    assert not rec["passed"]
    assert det["status"] == "fail"
    assert det["changed"] == ["short", "long", "tool_call", "multilingual"]
    assert "short" in rec["failures"][0] and "determinism" in rec["failures"][0]
    assert det["diff"].startswith("first difference at character")
    assert "short (qualified)" in det["diff"] and "short (now)" in det["diff"]
    # A failed run does not replace the baseline: the next comparison is still with the first record.
    assert RecordIndex(store.summaries()).latest_passing_for_lane("cand").id == base["id"]


def test_only_the_changed_prompt_is_named(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    with run_emulator(flavour="vllm", model=MODEL) as emu:
        base = run_qualify(emu.url, store, save=False)
        base["determinism"]["prompts"]["multilingual"]["hash"] = "0" * 16
        base["determinism"]["prompts"]["multilingual"]["output"] = "something else entirely"
        base["id"] = store.save(base)
        rec = run_qualify(emu.url, store)
    assert rec["determinism"]["changed"] == ["multilingual"]
    assert "multilingual" in rec["failures"][0]
    assert "-something" in rec["determinism"]["diff"]


def test_rebaseline_accepts_changed_outputs(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    with run_emulator(flavour="vllm", model=MODEL) as emu:
        run_qualify(emu.url, store)
        emu.configure(output_salt="new-weights")
        rec = run_qualify(emu.url, store, rebaseline=True)
        assert rec["passed"] and rec["determinism"]["status"] == "rebaselined"
        again = run_qualify(emu.url, store)
    assert again["determinism"]["status"] == "pass" and again["determinism"]["compared_to"] == rec["id"]


# -- sink probe ---------------------------------------------------------------------------------------


def test_empty_completion_for_one_probe_fails_the_sink_probe(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    with run_emulator(flavour="vllm", model=MODEL, empty_output_prompts=["Hi there!"]) as emu:
        rec = run_qualify(emu.url, store)
    sink = rec["sink"]
    assert not rec["passed"] and sink["status"] == "fail"
    bad = [p for p in sink["probes"] if not p["ok"]]
    assert [(p["prompt"], p["temperature"]) for p in bad] == [("Hi there!", 0.0), ("Hi there!", 1.0)]
    assert bad[0]["why"] == "empty completion"
    assert "'Hi there!' at temperature 0" in rec["failures"][0]
    assert rec["determinism"]["status"] == "baseline"  # the other gates still ran


# -- A/B/A ----------------------------------------------------------------------------------------------

# Small budgets (a few seconds per test). The tests share a 2-core machine with everything else, so
# differences under 10% count as "same" here (the default bar is 3%); a 2x slower lane is far beyond.
PERF = PerfOptions(shapes=parse_shapes("decode@2k,throughput@2"), samples=4, rounds=3, decode_tokens=24,
                   throughput_tokens=24, min_effect=0.10)
TIMING = {"ttft_ms": 60}


def abba(cand_tps: float, base_tps: float, tmp_path: Path, expected: dict[str, str]) -> dict[str, Any]:
    """A/B/A between two emulators. Verdicts are statistics on a shared, busy 2-core machine: when the
    first session's verdicts are not the expected ones, one more session decides (and both are shown)."""
    tries = []
    with run_emulator(flavour="vllm", model=MODEL, decode_tps=cand_tps, **TIMING) as cand, \
            run_emulator(flavour="vllm", model=MODEL, decode_tps=base_tps, **TIMING) as base:
        for _ in range(2):
            rec = run_qualify(cand.url, DirStore(tmp_path / f"q{len(tries)}"), perf=PERF, baseline_url=base.url)
            tries.append(rec)
            if {k: v["verdict"] for k, v in rec["performance"]["metrics"].items()} == expected:
                break
    verdicts = {k: v["verdict"] for k, v in rec["performance"]["metrics"].items()}
    assert verdicts == expected, json.dumps([t["performance"]["metrics"] for t in tries], indent=1)
    return rec


def test_abba_slower_candidate_is_worse(tmp_path: Path) -> None:
    rec = abba(200, 400, tmp_path, {"decode@2k decode": "worse", "decode@2k ttft": "same",
                                    "throughput@2 throughput": "worse"})
    perf = rec["performance"]
    m = perf["metrics"]
    assert 1.5 < m["decode@2k decode"]["baseline"] / m["decode@2k decode"]["candidate"] < 2.5
    assert perf["status"] == "fail" and not rec["passed"]
    assert "worse than lane base: decode@2k decode, throughput@2 throughput" in rec["failures"][0]
    assert set(perf["samples"]) == {"A1", "B", "A2"}


def test_abba_identical_lanes_are_same(tmp_path: Path) -> None:
    rec = abba(400, 400, tmp_path, {"decode@2k decode": "same", "decode@2k ttft": "same",
                                    "throughput@2 throughput": "same"})
    assert rec["passed"] and rec["performance"]["status"] == "pass"


def test_without_baseline_the_previous_record_numbers_are_compared(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    perf = PerfOptions(shapes=parse_shapes("decode@1k"), samples=3, rounds=1, decode_tokens=16)
    with run_emulator(flavour="vllm", model=MODEL, decode_tps=400) as emu:
        first = run_qualify(emu.url, store, perf=perf)
        assert first["performance"]["status"] == "skipped"  # nothing to compare with yet: noted, not failed
        assert first["passed"] and first["performance"]["metrics"]["decode@1k decode"]["verdict"] == "n/a"
        emu.configure(decode_tps=150)
        second = run_qualify(emu.url, store, perf=perf)
    m = second["performance"]["metrics"]["decode@1k decode"]
    assert m["verdict"] == "worse"
    assert second["performance"]["baseline"]["record"] == first["id"]
    assert second["performance"]["status"] == "warn" and second["passed"]  # stored numbers only warn


# -- refusal through the real gateway -------------------------------------------------------------------


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(exc.read())


def _get(url: str, headers: dict[str, str] | None = None) -> Any:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def _wait_state(gw_url: str, lane: str, state: str) -> dict[str, Any]:
    """The lane's qualification state once it is `state` (the gateway re-reads the records every 0.2 s)."""
    def got() -> dict[str, Any] | None:
        now = _get(gw_url + "/qualify/state", {"X-Gateway-Qualify": "sesame"})["lanes"][lane]
        return now if now["state"] == state else None

    return wait_until(got, what=f"lane {lane} {state}", interval=0.1)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def test_unqualified_lane_is_refused_until_qualified_or_overridden(tmp_path: Path) -> None:
    from gateway.cli.main import main

    records = tmp_path / "records"
    env = {"GATEWAY_QUALIFICATIONS": str(records), "GATEWAY_QUALIFY_TOKEN": "sesame",
           "GATEWAY_QUALIFY_POLL_S": "0.2"}
    with run_emulator(flavour="vllm", model=MODEL) as emu:
        lane = {"engine": "vllm", "replicas": [emu.url], "upstream_model": MODEL}
        routes = {"lanes": {"cand": lane}, "models": {"m": "cand"}}
        with run_gateway(routes, env=env) as gw:
            status, _, body = _post(gw.url + "/v1/chat/completions", CHAT)
            assert status == 503 and body["error"]["code"] == "lane_not_qualified"
            assert "no qualification record" in body["error"]["message"]
            assert "gateway qualify cand" in body["error"]["message"]
            ready = _get(gw.url + "/readyz")
            assert ready["lanes"]["cand"]["qualification"]["state"] == "unqualified"

            # The qualify route needs the token; with it, the unqualified lane is reachable by name.
            status, _, body = _post(gw.url + "/qualify/v1/chat/completions", {**CHAT, "model": "cand"})
            assert status == 403
            status, _, body = _post(gw.url + "/qualify/v1/chat/completions", {**CHAT, "model": "cand"},
                                    {"X-Gateway-Qualify": "sesame"})
            assert status == 200 and body["choices"][0]["message"]["content"]

            # Qualify through the running gateway: it stores the record and serves at once.
            rc = main(["qualify", "cand", "--gateway", gw.url, "--token", "sesame", "--no-perf", "--no-progress",
                       "--determinism-tokens", "8", "--probe-tokens", "8", "--json", "--by", "ci@test"])
            assert rc == 0
            files = list(records.glob("cand/*.json"))
            assert len(files) == 1 and json.loads(files[0].read_text())["by"] == "ci@test"
            assert json.loads(files[0].read_text())["identity"]["revision"] == "deepseek-ai/DeepSeek-V4-Flash"
            state = _wait_state(gw.url, "cand", "qualified")
            assert state["state"] == "qualified" and state["record"] == "cand/" + files[0].stem
            status, headers, body = _post(gw.url + "/v1/chat/completions", CHAT)
            assert status == 200 and "x-gateway-lane-override" not in headers

            # A changed identity (another limit) is not covered by the record: refused again, and the
            # reason names what changed.
            changed = {**lane, "limits": {"max_images": 2}}
            gw.write_routes({"lanes": {"cand": changed}, "models": {"m": "cand"}})
            gw.sighup()  # the file watcher would do it too; SIGHUP makes it prompt on a busy machine
            state = _wait_state(gw.url, "cand", "unqualified")
            assert state["state"] == "unqualified" and "limits" in state["reason"]
            status, _, body = _post(gw.url + "/v1/chat/completions", CHAT)
            assert status == 503 and body["error"]["code"] == "lane_not_qualified"

            # An override serves anyway, and says so.
            gw.write_routes({"lanes": {"cand": {**changed, "override": {"reason": "hotfix, INC-42"}}},
                             "models": {"m": "cand"}})
            gw.sighup()
            state = _wait_state(gw.url, "cand", "overridden")
            assert state["state"] == "overridden", gw.log()
            assert state["override"] == "hotfix, INC-42" and "limits" in state["reason"]
            status, headers, body = _post(gw.url + "/v1/chat/completions", CHAT)
            assert status == 200 and headers.get("x-gateway-lane-override") == "hotfix, INC-42"
            # /readyz caches its lane report for 2 s.
            wait_until(lambda: _get(gw.url + "/readyz")["lanes"]["cand"]["qualification"]["state"] == "overridden",
                       what="/readyz to report the override", interval=0.2)
            ready = _get(gw.url + "/readyz")["lanes"]["cand"]["qualification"]
            assert ready["state"] == "overridden" and ready["override"] == "hotfix, INC-42"


def test_revision_change_is_not_covered_by_the_record(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "q")
    from gateway.qualify.state import evaluate

    with run_emulator(flavour="vllm", model=MODEL, model_root="org/model@rev1") as emu:
        rec = run_qualify(emu.url, store)
    assert rec["identity"]["revision"] == "org/model@rev1"
    lane = lane_cfg(rec["identity"]["replicas"][0])
    index = RecordIndex(store.summaries())
    assert evaluate("cand", lane, index, "org/model@rev1")["state"] == "qualified"
    assert evaluate("cand", lane, index, None)["state"] == "qualified"  # not probed yet: the record stands
    moved = evaluate("cand", lane, index, "org/model@rev2")
    assert moved["state"] == "unqualified" and "revision changed" in moved["reason"]


def test_cli_in_process_with_a_record_file_as_baseline(tmp_path: Path, capsys) -> None:
    from gateway.cli.main import main

    with run_emulator(flavour="sglang", model=MODEL, decode_tps=400) as emu:
        routes = tmp_path / "routes.yaml"
        routes.write_text(json.dumps({"lanes": {"cand": {"engine": "sglang", "replicas": [emu.url],
                                                         "upstream_model": MODEL}}, "models": {"m": "cand"}}))
        small = ["--shapes", "decode@1k", "--samples", "3", "--decode-tokens", "16", "--determinism-tokens", "8",
                 "--probe-tokens", "8", "--no-progress", "--routes", str(routes)]
        assert main(["qualify", "cand", "--json", *small]) == 0
        first = json.loads(capsys.readouterr().out)
        path = tmp_path / "qualifications" / (first["id"] + ".json")
        assert path.is_file() and first["stored_in"] == str(tmp_path / "qualifications")
        emu.configure(decode_tps=100)
        assert main(["qualify", "cand", "--baseline", str(path), "--no-save", *small]) == 0  # stored: warns
    out = capsys.readouterr().out
    assert "Qualification of lane cand: PASSED" in out
    assert f"A/B/A against record {first['id']}" in out
    assert "decode@1k decode" in out and "worse" in out
    assert "note performance: worse than record" in out
    assert main(["qualify", "nope", "--routes", str(routes)]) == 2
