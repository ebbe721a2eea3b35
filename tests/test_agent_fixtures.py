"""The recorded sessions of real agent CLIs (tests/fixtures/agents, kept by RECORD_AGENT_FIXTURES=1
make test-agents), replayed through the gateway on the demo's lane without the CLIs: every request
answered 2xx, each session one conversation, every turn predicted as the engine reports it (within a
block)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.demo_lane import demo_gateway
from tests.support.gateway_proc import REPO
from tests.support.poll import wait_until

FIXTURES = Path(REPO) / "tests" / "fixtures" / "agents"
BLOCK = 16


@pytest.mark.parametrize("client", ["qwen-code", "claude-code", "opencode", "codex", "openai-agents"])
def test_a_recorded_session_replays_as_one_conversation(client: str) -> None:
    sent = json.loads((FIXTURES / f"{client}.json").read_text())
    gw, managers = demo_gateway()
    try:
        ids = []
        for request in sent:
            with httpx.stream("POST", gw.url + request["path"], json=request["body"], timeout=60) as r:
                r.read()
                assert r.status_code == 200, r.text[:300]
                ids.append(r.headers["x-request-id"])

        def rows() -> list[dict]:
            got = httpx.get(gw.url + "/admin/api/records", params={"limit": 100}).json()["records"]
            return [x for x in got if x["request_id"] in ids]

        wait_until(lambda: len(rows()) == len(ids) and all(x["verdict"] for x in rows()), what="every turn judged")
        by_conversation: dict[str, list[dict]] = {}
        for x in rows():
            by_conversation.setdefault(x["conversation"], []).append(x)
        session = sorted(max(by_conversation.values(), key=len), key=lambda x: x["turn"])
        assert len(session) >= 2 and [x["turn"] for x in session] == list(range(1, len(session) + 1))
        for x in session:
            assert abs(x["predicted_cached_tokens"] - x["cached_tokens"]) <= BLOCK, x
    finally:
        for cm in managers:
            cm.__exit__(None, None, None)
