"""The /admin page in a real headless browser (Debian's chromium) against a gateway with traffic.

Needs `apt-get install -y chromium`; skipped cleanly without it. The screenshot lands in
tests/artifacts/admin.png (gitignored) for a human to look at.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.emulator_proc import run_emulator
from tests.support.gateway_proc import run_gateway
from tests.test_records_e2e import TOOLS, agent_turns, lane, post, prompt_of, records

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parent / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get install -y chromium"),
]


def has_drift_api(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/admin/drift?limit=1", timeout=5):  # noqa: S310 - loopback
            return True
    except urllib.error.HTTPError:
        return False


def test_admin_page_shows_lanes_charts_and_drift_alerts() -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    with run_emulator(flavour="vllm", tokenizer="dsv41", default_thinking=True, reasoning_tokens=6,
                      decode_tps=400) as agent_emu, \
            run_emulator(flavour="sglang", ttft_ms=80, decode_tps=150) as fast_emu:
        routes = {
            "lanes": {"dsv41-vllm": lane(agent_emu.url, limits={"max_top_logprobs": 5}),
                      "glm-sglang": lane(fast_emu.url, engine="sglang", render={"template": None})},
            "models": {"agent": "dsv41-vllm", "glm": "glm-sglang"},
        }
        with run_gateway(routes) as gw:
            agent_turns(gw.url, agent_emu, "browser-conv", settle=True)  # cold, hit, drift, hit, eviction
            for i in range(6):
                post(gw.url, {"model": "glm", "messages": prompt_of(i, 40), "stream": True, "max_tokens": 24})
            # A client that changes its reasoning effort mid-conversation (pinned), and a refused request.
            first = [{"role": "user", "content": "Plan the refactor."}]
            post(gw.url, {"model": "agent", "messages": first, "reasoning_effort": "high", "tools": TOOLS},
                 {"X-Conversation-Id": "effort-conv"})
            post(gw.url, {"model": "agent", "messages": first + [{"role": "assistant", "content": "ok"},
                                                                 {"role": "user", "content": "Go on."}],
                          "reasoning_effort": "max", "tools": TOOLS}, {"X-Conversation-Id": "effort-conv"})
            assert post(gw.url, {"model": "agent", "messages": first, "logprobs": True, "top_logprobs": 20})[0] == 400
            records(gw.url)
            drift_api = has_drift_api(gw.url)

            ARTIFACTS.mkdir(exist_ok=True)
            errors: list[str] = []
            with sync_api.sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=str(CHROMIUM),
                    args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync"])
                try:
                    page = browser.new_page(viewport={"width": 1440, "height": 900})
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    # The page's Content-Security-Policy must not block anything it uses.
                    page.on("console", lambda msg: errors.append(msg.text)
                            if "Content Security Policy" in msg.text else None)
                    page.goto(gw.url + "/admin")
                    page.wait_for_selector("body[data-loaded='1']", timeout=20_000)
                    lanes = page.locator("#lanes .lane-name").all_inner_texts()
                    assert sorted(lanes) == ["dsv41-vllm", "glm-sglang"]
                    assert page.locator("#records tbody tr").count() >= 14
                    assert page.locator("#chart-hit svg").count() == 1
                    assert page.locator("#chart-decode svg rect").count() >= 1  # one bin when speeds agree
                    assert page.locator("#chart-lost svg").count() == 1
                    kpi = page.locator("#kpis .kpi").first.inner_text()
                    assert "14" in kpi
                    if drift_api:
                        alerts = page.locator("#drift .alert")
                        assert alerts.count() >= 1
                        # The scripted system-prompt edit is among them (the effort conversation, whose
                        # client sent back an answer the model never gave, adds a newer one).
                        texts = alerts.all_inner_texts()
                        assert any("system prompt" in t.lower() or "message 0" in t for t in texts), texts
                        assert page.locator("#drift .snip mark").count() >= 1  # the diverging part is marked
                    page.screenshot(path=str(ARTIFACTS / "admin.png"), full_page=True)
                    page.set_viewport_size({"width": 900, "height": 900})  # narrow screens reflow
                    page.wait_for_timeout(400)
                    page.screenshot(path=str(ARTIFACTS / "admin-narrow.png"), full_page=True)
                finally:
                    browser.close()
            assert not errors, errors
    assert (ARTIFACTS / "admin.png").stat().st_size > 10_000
