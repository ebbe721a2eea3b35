"""The /admin page in a real headless browser (Debian's chromium) against a gateway with traffic,
looked at the way a drift reviewer does, at 1024 and 1440 px.

Checked at both widths: no element overflows its container (the page never scrolls sideways),
every chart label lies inside its chart, every alert card has a severity and a remediation,
unavoidable alerts and re-pins are grouped apart, DeepSeek's special tokens are drawn as visible
markers (never as the raw full-width characters, which are empty boxes in many server fonts), the
conversation page shows the turns as a timeline with the diff at the drift. Needs
`apt-get install -y chromium`; skipped cleanly without it. Screenshots land in var/screenshots/
(gitignored) for a person to look at.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.admission import diverting_routes, newcomer
from tests.support.emulator_proc import AGENT_EMULATOR, run_emulator
from tests.support.gateway_proc import REPO, run_gateway
from tests.support.records import TOOLS, agent_turns, post, prompt_of, records
from tests.support.routes import emulator_lane, routes

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = REPO / "var" / "screenshots"
WIDTHS = (1024, 1440)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get install -y chromium"),
]

# Runs in the page: every element that sticks out of its parent (outside scrolling boxes and SVG),
# and every SVG text outside its SVG.
OVERFLOWS_JS = """
() => {
  const out = [];
  const visible = (el) => { const s = getComputedStyle(el); return s.display !== 'none' && s.visibility !== 'hidden'; };
  const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
  if (document.documentElement.scrollWidth > window.innerWidth + 1)
    out.push(`page scrolls sideways: ${document.documentElement.scrollWidth} > ${window.innerWidth}`);
  for (const el of document.querySelectorAll('body *')) {
    if (!visible(el) || el.closest('svg') || el.closest('[hidden]') || el.id === 'tooltip'
        || el.closest('datalist')) continue;
    const p = el.parentElement;
    if (!p || p === document.body) continue;
    const r = el.getBoundingClientRect(), q = p.getBoundingClientRect();
    if (!r.width && !r.height) continue;
    const ps = getComputedStyle(p);
    if (['auto', 'scroll', 'hidden'].includes(ps.overflowX)) {
      if (p.scrollWidth > p.clientWidth + 1 && ps.overflowX !== 'hidden')
        out.push(`${name(p)} scrolls sideways (${p.scrollWidth} > ${p.clientWidth})`);
      continue;
    }
    if (r.right > q.right + 1 || r.left < q.left - 1)
      out.push(`${name(el)} [${Math.round(r.left)}, ${Math.round(r.right)}] outside `
               + `${name(p)} [${Math.round(q.left)}, ${Math.round(q.right)}]`);
  }
  for (const svg of document.querySelectorAll('svg')) {
    if (!visible(svg)) continue;
    const b = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.left < b.left - 0.5 || r.right > b.right + 0.5 || r.top < b.top - 0.5 || r.bottom > b.bottom + 0.5)
        out.push(`label "${t.textContent}" outside its chart ${svg.parentElement.id}`);
    }
  }
  return out;
}
"""

# Bars and lines never pass the top gridline of their chart.
TOP_JS = """
() => {
  const out = [];
  for (const svg of document.querySelectorAll('.chart svg')) {
    const grid = [...svg.querySelectorAll('line.grid')].map((l) => +l.getAttribute('y1'));
    if (!grid.length) continue;
    const top = Math.min(...grid);
    for (const r of svg.querySelectorAll('rect[fill]:not([fill="transparent"])'))
      if (+r.getAttribute('y') < top - 0.5) out.push(`${svg.parentElement.id}: a bar passes the top gridline`);
  }
  return out;
}
"""


@pytest.fixture(scope="module")
def site() -> Iterator[dict[str, Any]]:
    with run_emulator(flavour="vllm", tokenizer="dsv41", default_thinking=True, reasoning_tokens=6,
                      decode_tps=400) as agent_emu, \
            run_emulator(flavour="sglang", ttft_ms=80, decode_tps=150) as fast_emu:
        with run_gateway(routes({"dsv41-vllm": emulator_lane(agent_emu.url, limits={"max_top_logprobs": 5}),
                                 "glm-sglang": emulator_lane(fast_emu.url, engine="sglang", render={"template": None})},
                                {"agent": "dsv41-vllm", "glm": "glm-sglang"})) as gw:
            agent_turns(gw.url, agent_emu, "browser-conv", settle=True)  # cold, hit, drift, hit, eviction
            for i in range(6):
                post(gw.url, {"model": "glm", "messages": prompt_of(i, 40), "stream": True, "max_tokens": 24},
                     {"User-Agent": "OpenAI/Python 1.99.0"})
            # A chat without tools: the template drops earlier reasoning (unavoidable by design).
            chat(gw.url, "chat-no-tools", "aider/0.80.1 (linux)", tools=False)
            # A deliberate re-pin: a new effort with X-Gateway-Repin.
            first = [{"role": "user", "content": "Plan the refactor."}]
            hdr = {"X-Conversation-Id": "repin-conv", "User-Agent": "opencode/0.5.1 ai-sdk/4"}
            _, raw = post(gw.url, {"model": "agent", "messages": first, "reasoning_effort": "high", "tools": TOOLS},
                          hdr)
            answer = json.loads(raw)["choices"][0]["message"]
            post(gw.url, {"model": "agent", "messages": first + [_back(answer), {"role": "user", "content": "Go on."}],
                          "reasoning_effort": "max", "tools": TOOLS}, {**hdr, "X-Gateway-Repin": "1"})
            assert post(gw.url, {"model": "agent", "messages": first, "logprobs": True, "top_logprobs": 20})[0] == 400
            records(gw.url)
            yield {"gw": gw}


def _back(msg: dict[str, Any]) -> dict[str, Any]:
    out = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("reasoning_content") or msg.get("reasoning"):
        out["reasoning_content"] = msg.get("reasoning_content") or msg.get("reasoning")
    return out


def chat(url: str, conv: str, ua: str, tools: bool) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Tell me about prefix caches."}]
    for step in range(3):
        body: dict[str, Any] = {"model": "agent", "messages": msgs}
        if tools:
            body["tools"] = TOOLS
        status, raw = post(url, body, {"X-Conversation-Id": conv, "User-Agent": ua})
        assert status == 200, raw
        msgs = msgs + [_back(json.loads(raw)["choices"][0]["message"]), {"role": "user", "content": f"And {step}?"}]
        records(url)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM),
                              args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                    "--disable-component-update", "--disable-sync"])
        try:
            yield b
        finally:
            b.close()


def wait_js(page, expression: str, timeout_s: float = 30.0) -> None:
    """Poll until `expression` is true in the page. page.wait_for_function compiles its predicate
    with `new Function`, which the admin page's CSP (no 'unsafe-eval') forbids; evaluate is not
    subject to the page's CSP."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"never true in the page: {expression}")
        page.wait_for_timeout(50)


def open_page(browser, url: str, width: int):
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # The admin page's Content-Security-Policy must not block anything it uses.
    page.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.goto(url)
    page.wait_for_selector("body[data-loaded='1']", timeout=30_000)
    page.wait_for_timeout(300)  # fonts and the second layout pass
    return page, errors


@pytest.mark.parametrize("width", WIDTHS)
def test_overview_reads_well_and_every_alert_says_what_to_do(site, browser, width: int) -> None:
    gw = site["gw"]
    page, errors = open_page(browser, gw.url + "/admin", width)
    try:
        assert sorted(page.locator("#lanes .lane-name").all_inner_texts()) == ["dsv41-vllm", "glm-sglang"]
        assert page.locator("#records tbody tr").count() >= 14
        for chart in ("#chart-hit", "#chart-decode", "#chart-lost", "#chart-costs"):
            assert page.locator(f"{chart} svg").count() == 1, chart
        assert page.locator("#lanes .verdict-legend span").count() >= 2  # the verdict bar has a legend
        # Units on every axis.
        assert page.locator("#chart-decode svg text.unit").all_text_contents() == ["requests", "tok/s"]
        assert "tokens" in " ".join(page.locator("#chart-lost svg text.unit").all_text_contents())
        # Cause labels are whole (wrapped onto two lines when long, never cut).
        lost_labels = page.locator("#chart-lost svg text").all_text_contents()
        assert not any(t.endswith("…") for t in lost_labels), lost_labels
        assert any("template" in t for t in lost_labels), lost_labels
        alerts = page.locator("#drift .alert")
        assert alerts.count() >= 3
        for i in range(alerts.count()):
            card = alerts.nth(i)
            assert card.locator(".badge.sev").inner_text() in ("critical", "major", "minor", "info")
            assert len(card.locator(".remedy").inner_text()) > 40
            assert card.locator(".badge.fix").count() == 1
        texts = alerts.all_inner_texts()
        assert any("system prompt" in t.lower() for t in texts), texts
        assert page.locator("#drift .group-unavoidable .alert[data-cause='reasoning_dropped_by_template']").count() == 1
        assert page.locator("#drift .group-repin .alert").count() == 1
        assert page.locator("#drift table.patterns tbody tr").count() >= 1  # what to forward or mute, per client
        assert "deliberate re-pin" in page.locator("#drift .group-repin").inner_text().lower() or \
            "re-pin" in page.locator("#drift .group-repin").inner_text().lower()
        assert page.locator("#drift .snip mark").count() >= 1  # the diverging part is marked
        # DeepSeek's special tokens are markers, never raw full-width bars.
        assert page.locator("#drift .snip .tok").count() >= 1
        assert "｜" not in "".join(page.locator("#drift .snip").all_inner_texts())
        assert page.locator("#offenders").inner_text().count("aider") >= 1  # who is costing us prefill
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"admin-{width}.png"), full_page=True)
        assert page.evaluate(OVERFLOWS_JS) == []
        assert page.evaluate(TOP_JS) == []
        # A filter narrows everything, and lives in the link.
        page.select_option("#filters select[name=severity]", "minor")
        wait_js(page, "location.hash.includes('severity=minor')")
        page.wait_for_timeout(800)
        sev = page.locator("#drift .alert .badge.sev").all_inner_texts()
        assert all(s == "minor" for s in sev)
    finally:
        page.close()
    assert not errors, errors


@pytest.mark.parametrize("width", WIDTHS)
def test_conversation_page_from_an_alert_and_by_client_key(site, browser, width: int) -> None:
    gw = site["gw"]
    page, errors = open_page(browser, gw.url + "/admin", width)
    try:
        # Linked from the alert...
        card = page.locator("#drift .alert", has_text="system prompt").first
        card.locator("a.conv").click()
        page.wait_for_selector("#conversation table.timeline")
        rows = page.locator("#conversation tr.turn")
        assert rows.count() == 5
        verdicts = [rows.nth(i).locator(".badge").first.inner_text() for i in range(5)]
        assert verdicts == ["cold", "hit", "drift", "hit", "eviction"]
        assert page.locator("#conversation tr.detail .snip mark").count() >= 1  # the diff at the drift
        assert page.locator("#conversation tr.detail .remedy").count() == 2  # drift and eviction say what to do
        assert page.locator("#conversation .cachebar").count() == 5
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"conversation-{width}.png"), full_page=True)
        assert page.evaluate(OVERFLOWS_JS) == []
        # ... and found by the client's own session key.
        page.goto(gw.url + "/admin#conversation=repin-conv")
        wait_js(page, "(document.querySelector('#conversation .conv-meta') || {}).innerText"
                               "?.includes('repin-conv')")
        meta = page.locator("#conversation .conv-meta").inner_text()
        assert "repin-conv" in meta and "opencode" in meta
        assert page.locator("#conversation .badge.repin").count() == 1
        page.fill("#find-key", "no-such-session")
        page.click("#find")
        wait_js(page, "document.querySelector('#conversation').innerText.includes('no conversation')")
    finally:
        page.close()
    assert not errors, errors


# The chart kit with the figures that broke it before: decode speeds up to 800,000 tok/s (the last
# label read "80000"), a tallest bar of 7 with ticks of 2 (it passed the top gridline), long causes.
CHART_KIT_JS = """
(w) => {
  const box = document.createElement('div');
  box.className = 'chart'; box.id = 'kit'; box.style.width = w + 'px';
  document.body.appendChild(box);
  Charts.histogram(box, { edges: [0, 200000, 400000, 600000, 800000], unit: 'tok/s',
    series: [{ name: 'a', color: '#000', values: [7, 3, 0, 1] }] });
  const labels = [...box.querySelectorAll('svg text')].map((t) => t.textContent);
  const b = box.querySelector('svg').getBoundingClientRect();
  const outside = [...box.querySelectorAll('svg text')].filter((t) => {
    const r = t.getBoundingClientRect(); return r.left < b.left - 0.5 || r.right > b.right + 0.5;
  }).map((t) => t.textContent);
  const grid = [...box.querySelectorAll('line.grid')].map((l) => +l.getAttribute('y1'));
  const tallest = Math.min(...[...box.querySelectorAll('rect')].map((r) => +r.getAttribute('y')));
  box.remove();
  return { labels, outside, top: Math.min(...grid), tallest };
}
"""


@pytest.mark.parametrize("width", WIDTHS)
def test_chart_kit_keeps_big_numbers_whole_and_bars_under_the_top_gridline(site, browser, width: int) -> None:
    page, errors = open_page(browser, site["gw"].url + "/admin", width)
    try:
        out = page.evaluate(CHART_KIT_JS, 420 if width == 1024 else 640)
        assert "800K" in out["labels"] and "0" in out["labels"], out
        assert out["outside"] == [], out
        assert out["tallest"] >= out["top"] - 0.5, out  # 7 fits under a gridline at 8
        assert "8" in out["labels"], out
    finally:
        page.close()
    assert not errors, errors


def test_mute_from_the_page_hides_the_alert_until_removed(site, browser) -> None:
    page, errors = open_page(browser, site["gw"].url + "/admin", 1440)
    try:
        page.on("dialog", lambda d: d.accept("known: aider drops tools in chat mode"))
        card = page.locator("#drift .alert[data-cause='reasoning_dropped_by_template']")
        assert card.count() == 1
        card.locator("button[data-kind='mute']").click()
        wait_js(page,
            "!document.querySelector(\"#drift .alert[data-cause='reasoning_dropped_by_template']\")")
        rules = page.locator("#rules table.rules tbody tr")
        assert rules.count() == 1 and "known: aider" in rules.first.inner_text()
        assert "1 muted" in page.locator("#drift-summary").inner_text()
        rules.first.locator("button.unrule").click()
        page.wait_for_selector("#drift .alert[data-cause='reasoning_dropped_by_template']")
        assert page.locator("#rules table.rules").count() == 0
    finally:
        page.close()
    assert not errors, errors


def test_records_say_what_admission_decided(browser) -> None:
    """A newcomer diverted to a lane with room and one refused after its hold: the records table says so
    (the badge's title carries the reason), and the diverted request's lane shows where it came from."""
    with run_emulator(**AGENT_EMULATOR) as emu, run_gateway(diverting_routes(emu.url)) as gw:
        assert post(gw.url, newcomer("pi", 1800))[0] == 200
        assert post(gw.url, newcomer("rho", 900))[0] == 200
        assert post(gw.url, newcomer("sigma", 2000))[0] == 429
        records(gw.url)
        page, errors = open_page(browser, gw.url + "/admin", 1440)
        try:
            wait_js(page, "document.querySelectorAll('#records .badge.admission').length >= 2")
            badges = page.locator("#records .badge.admission")
            texts = badges.all_inner_texts()
            assert "diverted → ds-b" in texts and any(t.startswith("refused after hold") for t in texts), texts
            titles = [badges.nth(i).get_attribute("title") for i in range(badges.count())]
            assert any("cache admission on ds: " in t and "ds-b holds it" in t for t in titles), titles
            assert "from ds" in page.locator("#records tbody").inner_text()
        finally:
            page.close()
    assert not errors, errors
