"""The gateway's trace joined to the real engine's: vLLM (started with --otlp-traces-endpoint) continues the
`traceparent` the gateway sends, so its request span has the gateway's upstream span as its parent."""

from __future__ import annotations

import httpx
import pytest

from tests.support.engine_proc import MODEL, EngineProc, engine_lane
from tests.support.gateway_proc import run_gateway
from tests.support.poll import wait_until

pytestmark = pytest.mark.engine



def test_the_engines_span_is_a_child_of_the_gateways(engine: EngineProc) -> None:
    rx = engine.traces
    assert rx is not None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.url, "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "gw-engine"}
    routes = {"lanes": {"ds": engine_lane(engine.url)}, "models": {"ds": "ds"}}
    with run_gateway(routes, env=env) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=120,
                       json={"model": "ds", "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
        assert r.status_code == 200, r.text
        wait_until(lambda: [s for s in rx.spans if s.service == "gw-engine" and s.name == f"chat {MODEL}"],
                   timeout=30, what="the gateway's upstream span")
        upstream = next(s for s in rx.spans if s.service == "gw-engine" and s.name == f"chat {MODEL}")
        wait_until(lambda: [s for s in rx.spans if s.parent_span_id == upstream.span_id], timeout=30,
                   what="the engine's span under the gateway's")
    server = next(s for s in rx.spans if s.service == "gw-engine" and s.kind == 2)
    engine_span = next(s for s in rx.spans if s.parent_span_id == upstream.span_id)
    assert engine_span.service != "gw-engine" and engine_span.trace_id == server.trace_id == upstream.trace_id
    assert upstream.parent_span_id == server.span_id
    assert server.attributes["gen_ai.provider.name"] == "vllm"
