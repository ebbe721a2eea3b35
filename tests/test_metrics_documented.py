"""docs/operating/metrics.md against a running gateway's /metrics, both ways: every documented family is
exported with its documented labels, every exported gateway_* family is documented, and the records
counter names each store it writes to (SQLite alone; PostgreSQL with Redis)."""

from __future__ import annotations

import re
from contextlib import ExitStack

import httpx

from tests.support.emulator_proc import KV_EMULATOR, run_kv_emulator
from tests.support.gateway_proc import REPO, run_gateway
from tests.support.poll import wait_until
from tests.support.postgres_proc import fresh_database
from tests.support.redis_proc import run_redis
from tests.support.routes import kv_lane, routes

DOC = REPO / "docs" / "operating" / "metrics.md"
SUFFIXES = ("_bucket", "_count", "_sum")


def documented() -> dict[str, set[str]]:
    out = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(gateway_[a-z_]+)` \| \w+ \| ([^|]+) \|", line)
        if m:
            out[m.group(1)] = {x.strip() for x in m.group(2).split(",") if x.strip() not in ("", "—")}
    return out


def exported(text: str) -> tuple[dict[str, set[frozenset[str]]], list[str]]:
    """Family name -> the label sets of its samples; and the sample lines."""
    fams: dict[str, set[frozenset[str]]] = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE gateway_"):
            fams[line.split()[2]] = set()
        elif line.startswith("gateway_"):
            samples.append(line)
            m = re.match(r"([a-z_]+)(?:\{(.*)\})?", line)
            name = m.group(1)
            if name not in fams:
                name = next(name[: -len(s)] for s in SUFFIXES if name.endswith(s) and name[: -len(s)] in fams)
            fams[name].add(frozenset(k for k in re.findall(r'([a-z_]+)="', m.group(2) or "") if k != "le"))
    return fams, samples


def scrape(gw_url: str) -> str:
    for i in range(2):
        r = httpx.post(f"{gw_url}/v1/chat/completions", timeout=30,
                       json={"model": "ds", "messages": [{"role": "user", "content": f"hello {i} " * 40}],
                             "max_tokens": 8})
        assert r.status_code == 200, r.text
    wait_until(lambda: 'outcome="written"' in httpx.get(gw_url + "/metrics").text, what="records written")
    return httpx.get(gw_url + "/metrics").text


def test_metrics_are_what_the_docs_say() -> None:
    doc = documented()
    assert len(doc) >= 50
    with ExitStack() as stack:
        emu, kv = stack.enter_context(run_kv_emulator(**KV_EMULATOR, cache_blocks=160))
        lanes = {"ds": kv_lane(emu.url, {emu.url: {**kv, "pool_tokens": 160 * 16}})}
        with run_gateway(routes(lanes)) as gw:
            sqlite_text = scrape(gw.url)
        pg = stack.enter_context(fresh_database())
        redis_port = stack.enter_context(run_redis())
        with run_gateway(routes(lanes, records={"postgres": pg}),
                         env={"GATEWAY_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"}) as gw:
            fleet_text = scrape(gw.url)
    for text in (sqlite_text, fleet_text):
        fams, samples = exported(text)
        undocumented = set(fams) - set(doc)
        assert not undocumented, f"exported, not in {DOC.name}: {sorted(undocumented)}"
        for name, labels in doc.items():
            if name == "gateway_analysis_worker_deaths_total" and name not in fams:
                continue  # only when analysis runs in a worker process
            assert name in fams, f"{name} is documented, not exported"
            for got in fams[name]:
                assert got == labels, f"{name}: exported with labels {sorted(got)}, documented {sorted(labels)}"
    stores = {tuple(re.findall(r'(outcome|store)="([a-z_]+)"', s)) for s in fleet_text.splitlines()
              if s.startswith("gateway_records_total")}
    by_store = {dict(s)["store"] for s in stores}
    assert by_store == {"builder", "postgres", "redis"}, stores
    assert 'gateway_records_total{outcome="written",store="sqlite"}' in sqlite_text
