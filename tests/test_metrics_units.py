"""Prometheus metrics without servers: what one exchange adds, label bounds, the live gauges."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.observe.metrics import BoundedLabel, Metrics, status_class
from gateway.core.verdict import CacheVerdict
from tests.support.exchanges import exchange
from tests.support.metrics import samples


def test_one_exchange_feeds_counters_and_histograms() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    ex = exchange(limits_fired=["max_top_logprobs"], effort_action="pinned", retries=1)
    ex.cache = CacheVerdict("drift", cause="effort_changed", tokens_lost=400, seconds_lost=0.2,
                            predicted_cached_tokens=500)
    m.observe(ex)
    s = samples(reg)
    lane = (("lane", "lane-a"),)
    assert s[("gateway_requests_total", (("lane", "lane-a"), ("status_class", "2xx")))] == 1
    assert s[("gateway_prompt_tokens_total", lane)] == 1000
    assert s[("gateway_cached_tokens_reported_total", lane)] == 600
    assert s[("gateway_cached_tokens_predicted_total", lane)] == 500
    assert s[("gateway_drift_tokens_lost_total", (("cause", "effort_changed"), ("lane", "lane-a")))] == 400
    assert s[("gateway_effort_rewrites_total", lane)] == 1
    assert s[("gateway_limits_fired_total", (("lane", "lane-a"), ("limit", "max_top_logprobs")))] == 1
    assert ("gateway_limit_rejections_total", (("lane", "lane-a"), ("limit", "max_top_logprobs"))) not in s
    assert s[("gateway_upstream_retries_total", lane)] == 1
    assert s[("gateway_ttft_seconds_count", lane)] == 1
    assert s[("gateway_ttft_seconds_sum", lane)] == __import__("pytest").approx(0.1)
    assert s[("gateway_decode_tokens_per_second_bucket", (("lane", "lane-a"), ("le", "60.0")))] == 1  # ~50 tok/s
    assert s[("gateway_decode_tokens_per_second_bucket", (("lane", "lane-a"), ("le", "40.0")))] == 0
    assert s[("gateway_inter_chunk_gap_seconds_count", lane)] == 10


def test_failed_requests_count_but_do_not_feed_latency() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    ex = exchange(status=400, error_code="too_many_images", limits_fired=["max_images"], usage=None)
    ex.t_forwarded = ex.t_first_byte = ex.t_first_token = ex.t_last_token = None
    ex.token_chunk_times = []
    m.observe(ex)
    m.observe(exchange(status=502, upstream_error="boom", replica="http://r2"))
    m.observe(exchange(cancelled=True))
    s = samples(reg)
    assert s[("gateway_limit_rejections_total", (("lane", "lane-a"), ("limit", "max_images")))] == 1
    assert s[("gateway_requests_total", (("lane", "lane-a"), ("status_class", "4xx")))] == 1
    assert s[("gateway_requests_total", (("lane", "lane-a"), ("status_class", "cancelled")))] == 1
    assert s[("gateway_upstream_errors_total", (("lane", "lane-a"), ("replica", "http://r2"),
                                                ("status_class", "5xx")))] == 1
    assert ("gateway_ttft_seconds_count", (("lane", "lane-a"),)) not in s
    assert s[("gateway_cache_verdicts_total", (("lane", "lane-a"), ("verdict", "unknown")))] == 3


def test_label_values_stay_bounded() -> None:
    label = BoundedLabel(limit=3)
    assert [label(f"cause {i}") for i in range(5)] == ["cause_0", "cause_1", "cause_2", "other", "other"]
    assert label("cause 1") == "cause_1"
    assert label("x" * 500) == "other"
    assert len(BoundedLabel()("y" * 500)) == 64


def test_status_class() -> None:
    assert status_class(exchange(status=200)) == "2xx"
    assert status_class(exchange(status=499)) == "cancelled"
    assert status_class(exchange(status=0)) == "none"
    assert status_class(exchange(status=503)) == "5xx"

