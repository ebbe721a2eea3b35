"""Gate 3: A/B/A performance. Candidate, baseline, candidate, in one session, over the same shapes.

Per run and shape: `samples` single-stream requests for a decode shape (decode speed and TTFT
per request), `rounds` rounds of `concurrency` simultaneous streams for a throughput shape
(completion tokens of the round divided by its wall time). Every request starts with a unique
line so the prefix cache never shortens its prefill.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from .client import LaneClient, Result
from .progress import SILENT, Progress
from .stats import judge, mean, stdev
from .suite import Shape, perf_body

# Differences smaller than these never count, whatever the intervals say.
ABS_FLOOR = {"ms": 5.0, "tok/s": 0.0}
# Latencies are compared by their medians (a few scheduling hiccups make their means jump).
STAT = {"ms": "median", "tok/s": "mean"}


@dataclass
class PerfOptions:
    shapes: list[Shape]
    samples: int = 5  # per decode shape per phase
    rounds: int = 4  # per throughput shape per phase
    decode_tokens: int = 128
    throughput_tokens: int = 64
    min_effect: float = 0.03

    def requests_per_phase(self) -> int:
        n = 1  # warm-up
        for s in self.shapes:
            n += self.samples if s.kind == "decode" else self.rounds * s.concurrency
        return n

    def as_dict(self) -> dict[str, Any]:
        return {"shapes": [s.name for s in self.shapes], "samples": self.samples, "rounds": self.rounds,
                "decode_tokens": self.decode_tokens, "throughput_tokens": self.throughput_tokens,
                "min_effect": self.min_effect}


class PhaseError(Exception):
    pass


def _check(client: LaneClient, label: str, r: Result) -> Result:
    if not r.ok:
        raise PhaseError(f"{label} on {client.name}: request failed: {r.error}")
    return r


async def warm_up(client: LaneClient, label: str) -> None:
    """Opens the connection pool; not counted."""
    _check(client, label, await client.chat({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                                             "temperature": 0.0}))


async def sample_shape(client: LaneClient, engine: str, shape: Shape, opts: PerfOptions, label: str,
                       bar: Any) -> dict[str, float]:
    """One sample of a shape's metrics: one request (decode) or one round of `concurrency` streams."""
    out: dict[str, float] = {}
    if shape.kind == "decode":
        r = _check(client, label, await client.chat(perf_body(shape, opts.decode_tokens, engine)))
        bar.update()
        if r.decode_tps is not None:
            out[f"{shape.name} decode"] = r.decode_tps
        if r.ttft_ms is not None:
            out[f"{shape.name} ttft"] = r.ttft_ms
        if r.prompt_tokens:
            out[f"{shape.name} prompt tokens"] = float(r.prompt_tokens)  # what the shape really sent
        return out
    bodies = [perf_body(shape, opts.throughput_tokens, engine) for _ in range(shape.concurrency)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(client.chat(b) for b in bodies))
    wall = time.perf_counter() - t0
    bar.update(shape.concurrency)
    for r in results:
        _check(client, label, r)
    if wall > 0:
        out[f"{shape.name} throughput"] = sum(r.tokens for r in results) / wall
    return out


async def run_abba(candidate: LaneClient, engine: str, baseline: LaneClient | None, baseline_engine: str,
                   opts: PerfOptions, progress: Progress = SILENT) -> dict[str, dict[str, list[float]]]:
    """Candidate (A1), baseline (B), candidate again (A2), in one session.

    The three runs are interleaved sample by sample (A1 B A2, A1 B A2, ...), so a slow spell of the
    machine or the network lands on all three alike instead of deciding a verdict. Without a
    baseline lane: A1 A2 only (the candidate's numbers and its drift).
    """
    phases = [("A1", candidate, engine)]
    if baseline is not None:
        phases.append(("B", baseline, baseline_engine))
    phases.append(("A2", candidate, engine))
    out: dict[str, dict[str, list[float]]] = {label: {} for label, _, _ in phases}
    per_phase = opts.requests_per_phase() - 1
    title = "A/B/A" if baseline is not None else "A/A (no baseline lane)"
    with progress.bar(title, per_phase * len(phases) + 1 + (baseline is not None)) as bar:
        await warm_up(candidate, "warm-up")
        bar.update()
        if baseline is not None:
            await warm_up(baseline, "warm-up")
            bar.update()
        for shape in opts.shapes:
            bar.set_postfix_str(shape.name)
            for _ in range(opts.samples if shape.kind == "decode" else opts.rounds):
                for label, client, eng in phases:
                    for metric, x in (await sample_shape(client, eng, shape, opts, label, bar)).items():
                        out[label].setdefault(metric, []).append(x)
    return out


def metric_units(shapes: list[Shape]) -> dict[str, tuple[str, bool]]:
    return {name: (unit, higher) for s in shapes for name, unit, higher in s.metrics()}


def summarise(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"mean": mean(v), "stdev": stdev(v), "n": len(v)} for k, v in samples.items()}


def compare(shapes: list[Shape], a1: dict[str, list[float]], a2: dict[str, list[float]],
            base: dict[str, list[float]] | None, min_effect: float) -> dict[str, dict[str, Any]]:
    """Verdict per metric; without a baseline, only the candidate's numbers and drift."""
    out: dict[str, dict[str, Any]] = {}
    for i, (metric, (unit, higher)) in enumerate(metric_units(shapes).items()):
        x1, x2 = a1.get(metric, []), a2.get(metric, [])
        if base is None or not base.get(metric):
            cand = [*x1, *x2]
            out[metric] = {"metric": metric, "unit": unit, "higher_is_better": higher, "candidate": mean(cand),
                           "drift": abs(mean(x1) - mean(x2)) if x1 and x2 else None, "verdict": "n/a",
                           "why": "no baseline numbers for this metric", "n_candidate": len(cand)}
            continue
        v = judge(metric, x1, x2, base[metric], higher_is_better=higher, unit=unit, min_effect=min_effect,
                  abs_floor=ABS_FLOOR.get(unit, 0.0), seed=i, stat=STAT.get(unit, "mean"))
        out[metric] = v.as_dict()
    return out
