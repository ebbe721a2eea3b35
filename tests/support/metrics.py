"""Reading Prometheus metrics: a gateway's /metrics, or a registry in the test's own process."""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def _parse(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def metric_samples(gw_url: str, headers: dict[str, str] | None = None) -> dict[str, dict[tuple, float]]:
    """The gateway's /metrics: sample name -> sorted label pairs -> value."""
    r = httpx.get(gw_url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return _parse(r.text)


def metric(gw_url: str, name: str, headers: dict[str, str] | None = None, **labels: str) -> float | None:
    """One sample of the gateway's /metrics, None when it is not there."""
    return metric_samples(gw_url, headers).get(name, {}).get(tuple(sorted(labels.items())))


def samples(registry: CollectorRegistry) -> dict[tuple, float]:
    """A registry in this process: (sample name, sorted label pairs) -> value."""
    return {(name, labels): value for name, by in _parse(generate_latest(registry).decode()).items()
            for labels, value in by.items()}
