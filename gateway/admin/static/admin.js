// The admin page: fetches /admin/api/* and /admin/drift every few seconds and draws them.
"use strict";

(() => {
  const esc = Charts.esc;
  const PALETTE = ["#2563eb", "#d97706", "#059669", "#9333ea", "#dc2626", "#0891b2", "#65a30d", "#db2777"];
  const VERDICT_COLORS = { hit: "#16a34a", drift: "#ea580c", eviction: "#7c3aed", cold: "#94a3b8", unknown: "#e2e8f0" };
  const REFRESH_MS = 5000;
  const laneColors = {};
  let paused = false;
  let timer = null;
  let last = null;

  // An admin key given once as ?key=... is kept for this tab and sent as a bearer token.
  const params = new URLSearchParams(location.search);
  if (params.get("key")) {
    sessionStorage.setItem("gatewayAdminKey", params.get("key"));
    history.replaceState(null, "", location.pathname);
  }
  const key = sessionStorage.getItem("gatewayAdminKey");

  async function api(path) {
    const resp = await fetch(path, { headers: key ? { Authorization: `Bearer ${key}` } : {}, cache: "no-store" });
    if (resp.status === 404 && (path.startsWith("/admin/drift") || path.startsWith("/admin/api/kv"))) return null;
    if (!resp.ok) {
      let msg = `${resp.status}`;
      try { msg += ` ${(await resp.json()).error.message}`; } catch (e) { /* not JSON */ }
      throw new Error(`${path}: ${msg}`);
    }
    return resp.json();
  }

  function colorOf(lane) {
    if (!(lane in laneColors)) laneColors[lane] = PALETTE[Object.keys(laneColors).length % PALETTE.length];
    return laneColors[lane];
  }

  // -- formatting ---------------------------------------------------------------------------
  const fmtS = (v) => (v === null || v === undefined ? "–" : v < 1 ? `${Math.round(v * 1000)} ms` : `${v.toFixed(2)} s`);
  const fmtPct = (v) => (v === null || v === undefined ? "–" : `${(v * 100).toFixed(1)}%`);
  const fmtTps = (v) => (v === null || v === undefined ? "–" : `${v.toFixed(1)}`);
  function fmtN(v) {
    if (v === null || v === undefined) return "–";
    if (v >= 1e6) return `${(v / 1e6).toFixed(2)}M`;
    if (v >= 1e4) return `${(v / 1e3).toFixed(1)}K`;
    return String(Math.round(v));
  }
  const fmtTime = (ts) => new Date(ts * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
  function ago(ts) {
    const s = Math.max(0, Date.now() / 1000 - ts);
    if (s < 60) return `${Math.round(s)}s ago`;
    if (s < 3600) return `${Math.round(s / 60)}m ago`;
    return `${(s / 3600).toFixed(1)}h ago`;
  }
  function windowS() { return Number(document.getElementById("window").value); }

  // -- sections -----------------------------------------------------------------------------
  function renderHeader(ov) {
    const c = ov.config || {};
    const up = ov.now - ov.started_at;
    const upText = up < 3600 ? `${Math.round(up / 60)} min` : up < 86400 ? `${(up / 3600).toFixed(1)} h` : `${(up / 86400).toFixed(1)} d`;
    let line = `routes v${c.version ?? "?"} · ${ov.lanes.length} lanes · up ${upText}`;
    if (c.last_reload_error) line += ` · last reload refused: ${c.last_reload_error}`;
    document.getElementById("config-line").textContent = line;
  }

  function renderKpis(stats, drift) {
    const t = stats.total;
    const hours = stats.window_s / 3600;
    const lostTokens = t.drift_tokens_lost + t.eviction_tokens_lost;
    const cards = [
      ["Requests", fmtN(t.requests), `${(t.requests / Math.max(hours, 1 / 60)).toFixed(1)} / hour`],
      ["Errors", t.errors ? `${t.errors}` : "0", t.requests ? fmtPct(t.error_ratio) + " of requests" : "no traffic"],
      ["TTFT p50", fmtS(t.ttft_p50_s), `p95 ${fmtS(t.ttft_p95_s)}`],
      ["Decode p50", t.decode_tps_p50 === null ? "–" : `${fmtTps(t.decode_tps_p50)}`, "tokens / second"],
      ["Cache hit", fmtPct(t.cache_hit_ratio), `${fmtN(t.cached_tokens)} of ${fmtN(t.prompt_tokens_with_cache_report)} tokens`],
      ["Tokens lost", fmtN(lostTokens), drift ? `${drift.alerts.length} drift alert${drift.alerts.length === 1 ? "" : "s"}` : `drift ${fmtN(t.drift_tokens_lost)} · evict ${fmtN(t.eviction_tokens_lost)}`],
    ];
    document.getElementById("kpis").innerHTML = cards.map(([label, value, detail]) =>
      `<div class="kpi"><div class="label">${label}</div><div class="value">${esc(value)}</div><div class="detail">${esc(detail)}</div></div>`).join("");
  }

  function verdictBar(verdicts) {
    const total = Object.values(verdicts || {}).reduce((a, b) => a + b, 0);
    if (!total) return `<div class="verdict-bar"></div>`;
    const parts = ["hit", "drift", "eviction", "cold", "unknown"].filter((v) => verdicts[v]).map((v) =>
      `<span title="${v}: ${verdicts[v]}" style="width:${(100 * verdicts[v]) / total}%;background:${VERDICT_COLORS[v]}"></span>`);
    return `<div class="verdict-bar">${parts.join("")}</div>`;
  }

  function qualificationBadge(q) {
    const st = q.state && typeof q.state === "object" ? q.state : { state: q.state };
    const state = String(st.state || st.status || (q.required ? "unqualified" : "not_required"));
    const why = st.reason || q.override || "";
    let cls = "bad";
    if (/^(qualified|pass|passed|ok)$/i.test(state)) cls = "ok";
    else if (/not_required/i.test(state)) cls = "";
    else if (/override/i.test(state) || q.override) cls = "warn";
    return `<span class="badge ${cls}" title="${esc(why)}">${esc(state.replace(/_/g, " "))}</span>`;
  }

  function renderLanes(ov, stats) {
    const html = ov.lanes.map((lane) => {
      const s = stats.lanes[lane.name] || null;
      const replicas = lane.replicas.map((r) => {
        const meta = r.breaker_open ? "breaker open" : r.probe_ms !== null && r.probe_ms !== undefined ? `${r.probe_ms} ms probe`
          : r.last_error ? esc(r.last_error) : "";
        return `<li><span class="dot ${r.health}" title="${r.health}"></span><span class="url" title="${esc(r.url)}">${esc(r.url)}</span>` +
          `<span class="meta" title="${esc(r.last_error || "")}">${r.inflight} in flight${meta ? " · " + meta : ""}</span></li>`;
      }).join("");
      const cell = (label, value) => `<div>${label}<b>${value}</b></div>`;
      return `<div class="lane" style="--lane:${colorOf(lane.name)}">
        <div class="lane-head"><span class="lane-name">${esc(lane.name)}</span>
          <span class="badges"><span class="badge">${esc(lane.engine)}</span>${qualificationBadge(lane.qualification)}
          <span class="badge ${lane.health}">${lane.health}</span></span></div>
        <div class="lane-models">${lane.models.map(esc).join(", ") || "no public model names"} → ${esc(lane.upstream_model)}</div>
        <div class="lane-stats">
          ${cell("requests", s ? fmtN(s.requests) : "0")}${cell("errors", s ? (s.errors ? `${s.errors} (${fmtPct(s.error_ratio)})` : "0") : "–")}
          ${cell("in flight", lane.inflight)}${cell("cache hit", s ? fmtPct(s.cache_hit_ratio) : "–")}
          ${cell("TTFT p50", s ? fmtS(s.ttft_p50_s) : "–")}${cell("TTFT p95", s ? fmtS(s.ttft_p95_s) : "–")}
          ${cell("decode p50", s && s.decode_tps_p50 !== null ? `${fmtTps(s.decode_tps_p50)} tok/s` : "–")}
          ${cell("drift lost", s ? fmtN(s.drift_tokens_lost) : "–")}
        </div>
        ${verdictBar(s && s.verdicts)}
        <ul class="replicas">${replicas}</ul></div>`;
    }).join("");
    document.getElementById("lanes").innerHTML = html || `<div class="none">no lanes configured</div>`;
  }

  function renderCharts(ch) {
    const lanes = Object.keys(ch.series.lanes);
    lanes.forEach(colorOf);
    Charts.line(document.getElementById("chart-hit"), {
      t: ch.series.t, yMin: 0, yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`,
      series: lanes.map((l) => ({ name: l, color: colorOf(l), values: ch.series.lanes[l].hit_ratio })),
      emptyText: "no cache reports in this window yet",
    });
    Charts.line(document.getElementById("chart-ttft"), {
      t: ch.series.t, yMin: 0, yFormat: fmtS,
      series: lanes.map((l) => ({ name: l, color: colorOf(l), values: ch.series.lanes[l].ttft_p50_s })),
      emptyText: "no streaming requests in this window yet",
    });
    const hist = ch.decode_histogram;
    Charts.histogram(document.getElementById("chart-decode"), {
      edges: hist.edges, unit: "tok/s", xFormat: (v) => String(+v.toFixed(2)),
      series: Object.keys(hist.lanes).map((l) => ({ name: l, color: colorOf(l), values: hist.lanes[l] })),
      emptyText: "no streamed decode in this window yet",
    });
    const causes = ch.lost_by_cause.causes;
    const used = new Set();
    causes.forEach((c) => Object.keys(c.by_lane).forEach((l) => used.add(l)));
    Charts.stacked(document.getElementById("chart-lost"), {
      rows: causes.map((c) => ({
        label: c.cause.replace(/_/g, " "), note: c.seconds >= 0.5 ? `≈${fmtS(c.seconds)} prefill` : "",
        parts: Object.entries(c.by_lane).map(([l, v]) => ({ name: l, color: colorOf(l), value: v })),
      })),
      format: fmtN,
      legend: [...used].map((l) => ({ name: l, color: colorOf(l) })),
      emptyText: "no tokens lost in this window: every prefix held",
    });
  }

  // Mark where two snippets stop agreeing: after their common prefix, find the nearest point where
  // they agree again (a run of RESYNC characters) and mark only what lies between.
  const RESYNC = 12;
  function diffPair(a, b) {
    a = a || ""; b = b || "";
    let p = 0;
    while (p < a.length && p < b.length && a[p] === b[p]) p++;
    let cut = null;
    const ra = a.length - p, rb = b.length - p;
    for (let d = 1; d <= ra + rb && cut === null; d++) {  // smallest total edit first
      for (let i = Math.max(0, d - rb); i <= Math.min(d, ra); i++) {
        const j = d - i;
        const run = Math.min(RESYNC, a.length - p - i, b.length - p - j);
        if (run >= Math.min(RESYNC, 4) && a.substr(p + i, run) === b.substr(p + j, run)) { cut = [i, j]; break; }
      }
    }
    if (cut === null) cut = [ra, rb];
    const part = (x, n, cls) => esc(x.slice(0, p)) + (n ? `<mark class="${cls}">${esc(x.slice(p, p + n))}</mark>` : "") + esc(x.slice(p + n));
    return [part(a, cut[0], "del"), part(b, cut[1], "ins")];
  }

  function renderDrift(drift) {
    const box = document.getElementById("drift");
    const hint = document.getElementById("drift-hint");
    if (drift === null) {
      hint.textContent = "";
      box.innerHTML = `<div class="none">drift alerts are not available in this gateway build</div>`;
      return;
    }
    const alerts = drift.alerts || [];
    hint.textContent = alerts.length ? `${alerts.length} newest first` : "newest first";
    if (!alerts.length) {
      box.innerHTML = `<div class="none">no drift alerts: every conversation kept its prefix</div>`;
      return;
    }
    box.innerHTML = alerts.map((a) => {
      const [before, after] = diffPair(a.snippet_before, a.snippet_after);
      const where = [a.message_index !== null && a.message_index !== undefined ? `message ${a.message_index}` : null,
        a.field ? `field ${esc(a.field)}` : null].filter(Boolean).join(" · ");
      const count = a.count > 1 ? `<span class="badge">×${a.count}</span>` : "";
      const cls = a.cause === "eviction" ? "eviction" : "drift";
      return `<div class="alert ${cls}">
        <div class="alert-head"><span class="badge ${cls}">${esc(String(a.cause || "unknown").replace(/_/g, " "))}</span>${count}
          <b>${esc(a.lane || "")}</b><span class="where">${where}</span>
          <span class="muted" title="${esc(a.conversation || "")}">conv <span class="conv mono">${esc(a.conversation || "–")}</span> · turn ${a.turn ?? "–"}</span>
          <span class="muted">${typeof a.time === "number" ? ago(a.time) : esc(a.time || "")}</span>
          <span class="lost">${fmtN(a.tokens_lost)} tokens${a.seconds_lost ? ` · ${fmtS(a.seconds_lost)}` : ""}</span></div>
        <div class="snips"><div class="snip"><span class="cap">previous turn</span>${before || '<span class="muted">(empty)</span>'}</div>
          <div class="snip"><span class="cap">this turn</span>${after || '<span class="muted">(empty)</span>'}</div></div></div>`;
    }).join("");
  }

  function renderRecords(records) {
    const box = document.getElementById("records");
    if (!records.length) { box.innerHTML = `<div class="none">no requests recorded yet</div>`; return; }
    const rows = records.map((r) => {
      const statusCls = r.cancelled ? "status-4" : `status-${String(r.status || 0)[0]}`;
      const cached = r.cached_tokens === null ? `<span class="muted" title="not reported">n/r</span>` : fmtN(r.cached_tokens);
      const pred = r.predicted_cached_tokens === null ? "" : ` <span class="muted">/ ${fmtN(r.predicted_cached_tokens)}</span>`;
      let effort = r.effort_applied === null ? "–" : esc(r.effort_applied);
      if (r.effort_requested !== null && r.effort_requested !== r.effort_applied) effort = `${esc(r.effort_requested)} → ${effort}`;
      if (r.effort_action && !["first", "kept", "off"].includes(r.effort_action)) effort += ` <span class="muted">${esc(r.effort_action)}</span>`;
      let limits = [];
      try { limits = r.limits_fired ? JSON.parse(r.limits_fired) : []; } catch (e) { /* keep [] */ }
      const limitText = limits.length ? ` <span class="badge warn" title="limits that fired">${limits.map(esc).join(", ")}</span>` : "";
      let verdict = `<span class="badge ${esc(r.verdict)}">${esc(r.verdict)}</span>${r.cause ? ` <span class="muted">${esc(r.cause.replace(/_/g, " "))}</span>` : ""}`;
      const kv = kvOf(r);
      if (kv && kv.displaced_by && kv.displaced_by.length) {  // issue 20: who pushed the prefix out
        const by = kv.displaced_by.map((d) => `${d.conversation || "unattributed"} (${fmtN(d.tokens)})`).join(", ");
        verdict += ` <span class="muted" title="${esc(kv.note || "")}">by ${esc(by)}</span>`;
      }
      return `<tr><td class="mono">${fmtTime(r.ts)}</td><td>${esc(r.model || "–")}</td><td>${esc(r.lane || "–")}</td>
        <td><span class="conv mono" title="${esc(r.conversation || "")} (${esc(r.conversation_source || "")})">${esc(r.conversation || "–")}</span></td>
        <td class="num">${r.turn ?? "–"}</td><td class="${statusCls}" title="${esc([r.error_code, r.upstream_error].filter(Boolean).join(": "))}">${r.cancelled ? "cancelled" : r.status}${limitText}</td>
        <td>${effort}</td>
        <td class="num">${fmtN(r.prompt_tokens)}</td><td class="num">${cached}${pred}</td><td class="wrap">${verdict}</td>
        <td class="num">${fmtS(r.ttft_s)}</td><td class="num">${fmtTps(r.decode_tps)}</td><td class="num">${fmtS(r.total_s)}</td>
        <td class="num">${r.completion_tokens ?? "–"}</td></tr>`;
    }).join("");
    box.innerHTML = `<table><thead><tr><th>time</th><th>model</th><th>lane</th><th>conversation</th><th class="num">turn</th>
      <th>status</th><th>effort</th><th class="num">prompt</th><th class="num">cached / pred.</th><th>verdict</th><th class="num">TTFT</th>
      <th class="num">tok/s</th><th class="num">total</th><th class="num">out</th></tr></thead><tbody>${rows}</tbody></table>`;
  }

  // -- refresh loop ---------------------------------------------------------------------------
  async function refresh() {
    const w = windowS();
    const buckets = w <= 900 ? 30 : 60;
    const banner = document.getElementById("error-banner");
    try {
      const [ov, ch, rec, drift, kv] = await Promise.all([
        api("/admin/api/overview"),
        api(`/admin/api/charts?window_s=${w}&buckets=${buckets}`),
        api("/admin/api/records?limit=50"),
        api("/admin/drift?limit=50").catch(() => null),
        api("/admin/api/kv").catch(() => null),
      ]);
      last = { ov, ch, rec, drift, kv };
      draw();
      banner.hidden = true;
      document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.loaded = "1";
    } catch (err) {
      banner.textContent = `Could not refresh: ${err.message}`;
      banner.hidden = false;
    }
  }

  function draw() {
    if (!last) return;
    const { ov, ch, rec, drift, kv } = last;
    [...ov.lanes.map((l) => l.name)].sort().forEach(colorOf);
    renderHeader(ov);
    renderKpis(ch.stats, drift);
    renderLanes(ov, ch.stats);
    renderCharts(ch);
    renderDrift(drift);
    renderKv(kv);
    renderRecords(rec.records);
  }

  function kvOf(r) {
    if (!r.kv) return null;
    try { return typeof r.kv === "string" ? JSON.parse(r.kv) : r.kv; } catch (e) { return null; }
  }

  // Issue 20: per replica, the KV-event stream, pool, working set, forecast and the pressure alert.
  function renderKv(kv) {
    const panel = document.getElementById("kv-panel");
    if (!kv || !kv.replicas || !kv.replicas.length) { panel.hidden = true; return; }
    panel.hidden = false;
    const rows = kv.replicas.map((r) => {
      const doomed = (r.forecast || []).filter((f) => f.will_be_evicted).map((f) => esc(f.conversation)).join(", ");
      const stream = r.stream.state === "live" ? "live" : `<b class="bad">${esc(r.stream.state)}</b>`;
      const alert = r.alert ? `<div class="bad">${esc(r.alert.message)}</div>` : "";
      return `<tr><td>${esc(r.lane)}</td><td class="mono">${esc(r.replica)}</td><td>${stream}</td>
        <td class="num">${fmtN(r.pool_tokens)}</td><td class="num">${fmtPct(r.occupancy)}</td>
        <td class="num">${fmtN(r.working_set_tokens)}</td><td class="num">${r.live_conversations}</td>
        <td class="num">${r.new_tokens_per_s}</td><td class="wrap">${doomed || "–"}${alert}</td></tr>`;
    }).join("");
    document.getElementById("kv").innerHTML = `<table><thead><tr><th>lane</th><th>replica</th><th>stream</th>
      <th class="num">pool</th><th class="num">occupancy</th><th class="num">working set</th><th class="num">live</th>
      <th class="num">new tok/s</th><th>evicted before next turn</th></tr></thead><tbody>${rows}</tbody></table>`;
  }

  function schedule() {
    clearTimeout(timer);
    if (!paused) timer = setTimeout(async () => { await refresh(); schedule(); }, REFRESH_MS);
  }

  const sel = document.getElementById("window");
  const saved = localStorage.getItem("gatewayAdminWindow");
  if (saved && [...sel.options].some((o) => o.value === saved)) sel.value = saved;
  sel.addEventListener("change", () => { localStorage.setItem("gatewayAdminWindow", sel.value); refresh(); });
  document.getElementById("pause").addEventListener("click", (e) => {
    paused = !paused;
    e.target.textContent = paused ? "Resume" : "Pause";
    schedule();
  });
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(draw, 150); });
  refresh().then(schedule);
})();
