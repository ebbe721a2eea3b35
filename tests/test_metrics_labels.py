"""/metrics: known label values at zero from the start, no empty label values, the public model, process metrics."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.support.routes import lane, routes
from tests.support.poll import wait_until


def _samples(gw) -> list:
    text = httpx.get(gw.url + "/metrics").text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_labels_primed_bounded_and_never_empty():
    with run_emulator(flavour="vllm") as emu:
        with run_gateway(routes({"a": lane(emu.url)}, {"pub": "a"})) as gw:
            fresh = _samples(gw)
            by = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fresh}
            assert by[("gateway_requests_total", (("lane", "a"), ("status_class", "5xx")))] == 0
            assert by[("gateway_cache_verdicts_total", (("lane", "a"), ("verdict", "eviction")))] == 0
            assert by[("gateway_model_requests_total", (("lane", "a"), ("model", "pub"), ("status_class", "2xx")))] == 0
            assert any(s.name == "process_cpu_seconds_total" for s in fresh)
            assert any(s.name == "process_resident_memory_bytes" for s in fresh)
            r = httpx.post(gw.base_url + "/chat/completions",
                           json={"model": "pub", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 200, r.text
            for i in range(3):  # arbitrary names must not become label values
                httpx.post(gw.base_url + "/chat/completions",
                           json={"model": f"junk-{i}", "messages": [{"role": "user", "content": "x"}]})
            pub_ok = ("gateway_model_requests_total", (("lane", "a"), ("model", "pub"), ("status_class", "2xx")))
            unknown = ("gateway_model_requests_total",
                       (("lane", "none"), ("model", "unknown"), ("status_class", "4xx")))

            def counted() -> dict | None:
                by = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in _samples(gw)}
                return by if by.get(unknown) == 3 and by.get(pub_ok) else None

            # The first request's analysis starts the analysis worker: its count may take a while.
            by = wait_until(counted, what="both requests counted in /metrics", interval=0.1)
            after = _samples(gw)
            assert by[pub_ok] == 1 and by[unknown] == 3
            assert not any("junk" in str(s.labels) for s in after)
            empty = [(s.name, s.labels) for s in after if any(v == "" for v in s.labels.values())]
            assert not empty, empty
