"""Verdicts for A/B/A: a 95% bootstrap interval of the difference of means, and the candidate's
own A-to-A drift as the bar a difference must clear before it counts as better or worse.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any, Sequence


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def stdev(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def median(xs: Sequence[float]) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


STATS = {"mean": mean, "median": median}


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], *, level: float = 0.95, resamples: int = 2000,
                      seed: int = 0, stat: str = "mean") -> tuple[float, float]:
    """Percentile bootstrap interval of stat(a) - stat(b). Seeded: the same samples give the same interval."""
    if not a or not b:
        return (math.nan, math.nan)
    f = STATS[stat]
    rng = random.Random(seed)
    na, nb = len(a), len(b)
    diffs = []
    for _ in range(resamples):
        ma = f([a[rng.randrange(na)] for _ in range(na)])
        mb = f([b[rng.randrange(nb)] for _ in range(nb)])
        diffs.append(ma - mb)
    diffs.sort()
    lo_i = int(math.floor((1 - level) / 2 * resamples))
    hi_i = min(resamples - 1, int(math.ceil((1 + level) / 2 * resamples)) - 1)
    return (diffs[lo_i], diffs[hi_i])


@dataclass
class Verdict:
    metric: str
    unit: str
    higher_is_better: bool
    stat: str  # mean | median
    candidate: float  # the statistic over both candidate runs (A1 + A2)
    baseline: float
    diff: float  # candidate - baseline
    diff_pct: float | None
    ci95: tuple[float, float]
    drift: float  # |mean(A1) - mean(A2)|: how much the candidate moved against itself
    drift_bound: float  # the far end of the 95% interval of mean(A2) - mean(A1): how much it may move
    bar: float  # the largest of the drift bound, the minimum effect and the absolute floor
    verdict: str  # better | worse | same
    why: str
    n_candidate: int
    n_baseline: int

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        return d


def judge(metric: str, a1: Sequence[float], a2: Sequence[float], b: Sequence[float], *, higher_is_better: bool,
          unit: str = "", min_effect: float = 0.03, abs_floor: float = 0.0, seed: int = 0,
          stat: str = "mean") -> Verdict:
    """better / worse / same for one metric.

    "same" when the 95% interval of the difference contains zero, or when the difference is no
    larger than the bar: the candidate's A-to-A drift, or `min_effect` of the baseline (relative),
    or `abs_floor` (absolute), whichever is largest. A difference inside the candidate's own
    repeat drift is never "better".

    The drift used as the bar is the far end of the 95% interval of mean(A2) - mean(A1), not just
    the observed gap: with a handful of samples per run the observed gap alone is often luckily
    small, and the bar is meant to say how far the candidate can move between two runs of itself.
    `stat`: "mean" (speeds) or "median" (latencies, whose tails are scheduling noise).
    """
    f = STATS[stat]
    cand = [*a1, *a2]
    mc, mb = f(cand), f(b)
    diff = mc - mb
    lo, hi = bootstrap_diff_ci(cand, b, seed=seed, stat=stat)
    drift = abs(f(a1) - f(a2)) if a1 and a2 else 0.0
    if a1 and a2:
        dlo, dhi = bootstrap_diff_ci(a2, a1, seed=seed + 1, stat=stat)
        drift_bound = max(abs(dlo), abs(dhi), drift)
    else:
        drift_bound = drift
    bar = max(drift_bound, min_effect * abs(mb) if not math.isnan(mb) else 0.0, abs_floor)
    pct = (diff / mb * 100.0) if mb else None
    if math.isnan(lo) or math.isnan(hi):
        verdict, why = "same", "not enough samples to judge"
    elif lo <= 0.0 <= hi:
        verdict, why = "same", "the 95% interval of the difference contains 0"
    elif abs(diff) <= bar:
        if bar == drift_bound:
            why = f"|difference| {abs(diff):.3g} is within the candidate's own A-to-A drift (up to {drift_bound:.3g})"
        else:
            why = f"|difference| {abs(diff):.3g} is below the minimum effect {bar:.3g}"
        verdict = "same"
    else:
        improved = (diff > 0) == higher_is_better
        verdict = "better" if improved else "worse"
        why = (f"95% interval [{lo:.3g}, {hi:.3g}] excludes 0 and |difference| {abs(diff):.3g} "
               f"exceeds the bar {bar:.3g}")
    return Verdict(metric, unit, higher_is_better, stat, mc, mb, diff, pct, (lo, hi), drift, drift_bound, bar, verdict,
                   why, len(cand), len(b))
