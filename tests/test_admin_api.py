"""The /admin page and its JSON APIs in-process (Starlette's TestClient), with and without a guard."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.core.verdict import CacheVerdict
from tests.support.exchanges import exchange
from tests.support.inprocess import make_app
from tests.support.routes import lane, routes


@pytest.fixture()
def app(tmp_path: Path):
    app = make_app(routes({"lane-a": lane("http://127.0.0.1:9", engine="sglang", upstream_model="m")},
                          {"public-a": "lane-a"}), tmp_path)
    with TestClient(app) as client:
        gw = app.state.gateway
        records = gw.records
        for i in range(5):
            ex = exchange(request_id=f"r{i}", lane="lane-a")
            ex.cache = CacheVerdict("drift" if i == 4 else "hit", cause="tools_reordered", tokens_lost=123)
            records.sink(ex, None)
        records.sqlite.flush()
        yield client, gw


def test_page_and_static_files(app) -> None:
    client, _ = app
    page = client.get("/admin")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "/admin/static/admin.js" in page.text
    for name in ("admin.js", "charts.js", "admin.css"):
        assert client.get(f"/admin/static/{name}").status_code == 200
    assert client.get("/admin/static/feature.py").status_code == 404
    assert client.get("/admin/static/..%2Ffeature.py").status_code == 404


def test_overview_lists_lanes_with_health(app) -> None:
    client, _ = app
    ov = client.get("/admin/api/overview").json()
    lane = ov["lanes"][0]
    assert lane["name"] == "lane-a" and lane["models"] == ["public-a"] and lane["engine"] == "sglang"
    assert lane["replicas"][0]["url"] == "http://127.0.0.1:9"
    assert lane["replicas"][0]["health"] == "down"  # nothing listens on port 9: the probe says so
    assert ov["records"]["built"] == 5


def test_records_stats_and_charts(app) -> None:
    client, _ = app
    recs = client.get("/admin/api/records", params={"limit": 3}).json()["records"]
    assert [r["request_id"] for r in recs] == ["r4", "r3", "r2"]
    assert client.get("/admin/api/records", params={"lane": "other"}).json()["records"] == []
    stats = client.get("/admin/api/stats", params={"window_s": 600}).json()
    assert stats["lanes"]["lane-a"]["requests"] == 5
    assert stats["lanes"]["lane-a"]["drift_tokens_lost_by_cause"] == {"tools_reordered": 123}
    charts = client.get("/admin/api/charts", params={"window_s": 600, "buckets": 10}).json()
    assert {"stats", "series", "decode_histogram", "lost_by_cause", "costs"} <= set(charts)
    assert sum(charts["series"]["lanes"]["lane-a"]["requests"]) == 5
    assert client.get("/admin/api/stats", params={"window_s": "soon"}).status_code == 400


def test_metrics_endpoint_exposes_live_gauges(app) -> None:
    client, _ = app
    text = client.get("/metrics").text
    assert 'gateway_inflight_requests{lane="lane-a"} 0.0' in text
    assert 'gateway_replica_up{lane="lane-a",replica="http://127.0.0.1:9"}' in text
    assert 'gateway_records_total{outcome="written",store="sqlite"} 5.0' in text
    assert "_created" not in text


def test_grafana_dashboard_uses_only_exported_metric_names(app) -> None:
    import json
    import re

    client, _ = app
    text = client.get("/metrics").text
    declared = set(re.findall(r"^# TYPE (gateway_\w+) (\w+)", text, re.M))
    names = {name for name, _ in declared}
    names |= {f"{name}{suffix}" for name, kind in declared if kind == "histogram"
              for suffix in ("_bucket", "_sum", "_count")}
    dashboard = json.loads((Path(__file__).parents[1] / "dashboards" / "grafana.json").read_text())
    used = {m for p in dashboard["panels"] for t in p.get("targets", []) for m in re.findall(r"gateway_\w+", t["expr"])}
    assert used and used <= names, sorted(used - names)
