"""One qualification run: the three gates in order, then the record that says what happened."""

from __future__ import annotations

import getpass
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from .client import LaneClient
from .determinism import run_determinism
from .identity import LaneIdentity
from .perf import PerfOptions, PhaseError, compare, run_abba, summarise
from .progress import SILENT, Progress
from .records import SCHEMA, iso
from .sink import run_sink_probe
from .suite import DEFAULT_SEED


def whoami() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass
class Baseline:
    """What the candidate is compared with in A/B/A."""

    kind: str  # "lane": measured live between A1 and A2 | "record": numbers stored in a record
    label: str
    client: LaneClient | None = None
    engine: str = "vllm"
    record: dict[str, Any] | None = None

    def stored_samples(self) -> dict[str, list[float]] | None:
        perf = (self.record or {}).get("performance") or {}
        samples = perf.get("samples") or {}
        out: dict[str, list[float]] = {}
        for phase in ("A1", "A2"):  # the record's own candidate runs
            for metric, xs in (samples.get(phase) or {}).items():
                out.setdefault(metric, []).extend(xs)
        return out or None


@dataclass
class QualifyOptions:
    seed: int = DEFAULT_SEED
    determinism_tokens: int = 64
    probe_tokens: int = 128
    perf: PerfOptions | None = None  # None: skip A/B/A
    rebaseline: bool = False
    allow_worse: bool = False
    by: str = field(default_factory=whoami)
    progress: Progress = SILENT


async def qualify(name: str, client: LaneClient, identity: LaneIdentity, engine: str, *,
                  previous: dict[str, Any] | None, baseline: Baseline | None,
                  opts: QualifyOptions) -> dict[str, Any]:
    """Run the gates against `client` and return the record (not yet saved).

    `previous`: the lane's latest passing record (determinism compares with it; without an explicit
    baseline its performance numbers are the baseline).
    """
    t0 = time.time()
    if identity.revision is None:
        try:
            identity = identity.with_revision(await client.revision())
        except Exception:  # noqa: BLE001 - the revision is only "if known"
            pass
    determinism = await run_determinism(client, seed=opts.seed, max_tokens=opts.determinism_tokens,
                                        previous=previous, rebaseline=opts.rebaseline, progress=opts.progress)
    sink = await run_sink_probe(client, seed=opts.seed, max_tokens=opts.probe_tokens, progress=opts.progress)
    if baseline is None and previous is not None and (previous.get("performance") or {}).get("samples"):
        baseline = Baseline("record", f"the previous qualified record {previous.get('id')}", record=previous)
    performance = await _performance(name, client, engine, baseline, opts)

    failures: list[str] = []
    warnings: list[str] = []
    if determinism["status"] == "fail":
        failures.append("determinism: " + determinism["summary"])
    elif determinism["status"] == "rebaselined":
        warnings.append("determinism: " + determinism["summary"])
    if sink["status"] == "fail":
        failures.append("sink probe: " + sink["summary"])
    if performance["status"] == "fail":
        failures.append("performance: " + performance["summary"])
    elif performance["status"] in ("warn", "skipped"):
        warnings.append("performance: " + performance["summary"])
    return {
        "schema": SCHEMA,
        "lane": name,
        "passed": not failures,
        "failures": failures,
        "warnings": warnings,
        "identity": identity.fields,
        "identity_hash": identity.hash,
        "config_hash": identity.config_hash,
        "by": opts.by,
        "at": iso(t0),
        "at_unix": t0,
        "duration_s": round(time.time() - t0, 3),
        "via": client.where,
        "determinism": determinism,
        "sink": sink,
        "performance": performance,
    }


async def _performance(name: str, client: LaneClient, engine: str, baseline: Baseline | None,
                       opts: QualifyOptions) -> dict[str, Any]:
    popts = opts.perf
    if popts is None:
        return {"status": "skipped", "summary": "A/B/A not run (--no-perf)"}
    base_info: dict[str, Any] | None = None
    if baseline is not None:
        base_info = {"kind": baseline.kind, "label": baseline.label}
        if baseline.record is not None:
            base_info["record"] = baseline.record.get("id")
    live = baseline.client if baseline is not None and baseline.kind == "lane" else None
    try:
        samples = await run_abba(client, engine, live, baseline.engine if baseline else engine, popts, opts.progress)
    except PhaseError as exc:
        return {"status": "fail", "summary": str(exc), "options": popts.as_dict(), "baseline": base_info}
    if "B" in samples:
        base_samples: dict[str, list[float]] | None = samples["B"]
    elif baseline is not None:
        base_samples = baseline.stored_samples()
    else:
        base_samples = None
    metrics = compare(popts.shapes, samples["A1"], samples["A2"], base_samples, popts.min_effect)
    worse = [m for m, v in metrics.items() if v["verdict"] == "worse"]
    better = [m for m, v in metrics.items() if v["verdict"] == "better"]
    result: dict[str, Any] = {"options": popts.as_dict(), "baseline": base_info, "metrics": metrics,
                              "samples": samples, "phases": {k: summarise(v) for k, v in samples.items()}}
    if base_samples is None:
        result.update(status="skipped" if baseline is None else "warn",
                      summary="no baseline to compare with: candidate numbers and A-to-A drift recorded"
                      if baseline is None else f"{baseline.label} holds no comparable numbers")
        return result
    interleaved = "B" in samples
    if interleaved:
        result["note"] = "baseline measured in this session, interleaved A1 B A2 sample by sample"
    else:
        result["note"] = (f"baseline numbers from {baseline.label if baseline else '?'}: another session, so "
                          "machine conditions may differ; a 'worse' verdict warns instead of failing")
    if worse:
        listed = ", ".join(worse)
        if live and not opts.allow_worse:
            result.update(status="fail", summary=f"worse than {baseline.label if baseline else 'baseline'}: {listed}")
        else:
            result.update(status="warn", summary=f"worse than {baseline.label if baseline else 'baseline'}: {listed}")
    else:
        result.update(status="pass", summary=f"{len(metrics)} metrics: " +
                      (f"better on {', '.join(better)}, " if better else "") + "no metric worse")
    return result
