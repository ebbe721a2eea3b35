"""/metrics: known label values at zero from the start, no empty label values, the public model, process metrics."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway


def _samples(gw) -> list:
    text = httpx.get(gw.url + "/metrics").text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_labels_primed_bounded_and_never_empty():
    with run_emulator(flavour="vllm") as emu:
        routes = {"lanes": {"a": {"replicas": [emu.url], "upstream_model": "deepseek-v4-flash",
                                  "qualification": "not_required"}},
                  "models": {"pub": "a"}}
        with run_gateway(routes) as gw:
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
            deadline = time.monotonic() + 30  # the first request's analysis starts the analysis worker
            while time.monotonic() < deadline:
                after = _samples(gw)
                by = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in after}
                if by.get(("gateway_model_requests_total",
                           (("lane", "none"), ("model", "unknown"), ("status_class", "4xx")))) == 3 and \
                        by.get(("gateway_model_requests_total",
                                (("lane", "a"), ("model", "pub"), ("status_class", "2xx")))):
                    break
                time.sleep(0.1)
            assert by[("gateway_model_requests_total", (("lane", "a"), ("model", "pub"), ("status_class", "2xx")))] == 1
            assert by[("gateway_model_requests_total",
                       (("lane", "none"), ("model", "unknown"), ("status_class", "4xx")))] == 3
            assert not any("junk" in str(s.labels) for s in after)
            empty = [(s.name, s.labels) for s in after if any(v == "" for v in s.labels.values())]
            assert not empty, empty
