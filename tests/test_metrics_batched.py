"""The metrics sink's shortcuts decide exactly as the general path (gateway/observe/metrics.py).

Requests' increments and observations wait in plain dicts until a flush (a scrape, FLUSH_S, or at once
without an event loop); histogram observations are kept as counts per bucket. The registry must then
read exactly what prometheus_client's own inc() and observe(), one call per value, would have made it
read; and BoundedLabel's memo must name every value as the regular expression does.
"""

from __future__ import annotations

import math
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.observe.metrics import DURATION_BUCKETS, GAP_BUCKETS, BoundedLabel, Metrics, _Observed
from tests.support.metrics import samples
from tests.support.exchanges import exchange
from tests.support.poll import until

values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                   st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 600.0, 1800.0, -1.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(values, max_size=40), st.sampled_from([DURATION_BUCKETS, GAP_BUCKETS]))
def test_bucket_counts_read_as_observe_one_by_one(observed: list[float], buckets: tuple) -> None:
    direct, batched = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", ["lane"], buckets=buckets, registry=direct).labels("x")
    b = Histogram("h", "h", ["lane"], buckets=buckets, registry=batched).labels("x")
    pending = _Observed(b)
    for v in observed:
        a.observe(v)
        pending.add(v)
    pending.apply()
    assert _text(direct) == _text(batched)


def _text(registry: CollectorRegistry) -> str:
    # The exposition text itself (NaN prints as NaN on both sides), without the creation times.
    return "\n".join(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)


def test_a_flush_applies_counts_once_and_starts_afresh() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    c = Counter("c", "c", ["lane"], registry=reg).labels("x")
    m._inc(c, 2)
    m._inc(c, 3)
    m._inc(c, -1)  # refused, as inc() refuses it
    assert samples(reg)[("c_total", (("lane", "x"),))] == 0
    m.flush()
    m.flush()
    assert samples(reg)[("c_total", (("lane", "x"),))] == 5


async def test_with_a_loop_requests_reach_the_registry_at_the_flush() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    for _ in range(3):
        m.observe(exchange())
    lane = (("lane", "lane-a"), ("status_class", "2xx"))
    assert samples(reg)[("gateway_requests_total", lane)] == 0, "waits for the flush"
    m.flush()  # what a scrape (MetricsExport.route) does first
    assert samples(reg)[("gateway_requests_total", lane)] == 3
    m.observe(exchange())  # with a loop: a timer flushes it within FLUSH_S, no scrape needed
    await until(lambda: samples(reg)[("gateway_requests_total", lane)] == 4, what="the timer's flush")


def _reference(limit: int):
    """BoundedLabel as it was before its memo."""
    clean = re.compile(r"[^A-Za-z0-9_.:/-]+")
    seen: set[str] = set()

    def label(value) -> str:
        text = clean.sub("_", str(value))[:64] or "none"
        if text in seen:
            return text
        if len(seen) >= limit:
            return "other"
        seen.add(text)
        return text
    return label


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=70), st.sampled_from(["a b", "a_b", "a", "", "x" * 80]),
                          st.integers(-3, 3)), max_size=60),
       st.integers(1, 6))
def test_bounded_label_memo_names_values_as_the_expression_does(seq: list, limit: int) -> None:
    ours, ref = BoundedLabel(limit), _reference(limit)
    assert [ours(v) for v in seq] == [ref(v) for v in seq]


def test_nan_sum_is_nan_both_ways() -> None:
    reg = CollectorRegistry()
    h = Histogram("h", "h", buckets=(1.0,), registry=reg)
    pending = _Observed(h)
    pending.add(float("nan"))
    pending.add(0.5)
    pending.apply()
    assert math.isnan(samples(reg)[("h_sum", ())])
