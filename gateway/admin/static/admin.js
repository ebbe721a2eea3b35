// The admin page: fetches /admin/api/* every few seconds and draws them. The filters and the
// conversation being looked at live in the URL's hash (#lane=...&client=...&conversation=...), so a
// reviewer can send a link to exactly what they see.
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
    const src = ov.records && ov.records.source;
    if (src) {
      line += src.scope === "fleet" ? ` · records: whole fleet (${src.backend})` : ` · records: this host (${src.backend})`;
      if (src.backend === "postgres" && !src.connected) line += ` · records database unreachable, ${src.queued} waiting, ${src.dropped} dropped`;
    }
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
      ["Tokens lost", fmtN(lostTokens), drift ? `${drift.alerts.length} drift alert${drift.alerts.length === 1 ? "" : "s"} · ${(drift.counts || {}).paging || 0} paging` : `drift ${fmtN(t.drift_tokens_lost)} · evict ${fmtN(t.eviction_tokens_lost)}`],
    ];
    document.getElementById("kpis").innerHTML = cards.map(([label, value, detail]) =>
      `<div class="kpi"><div class="label">${label}</div><div class="value">${esc(value)}</div><div class="detail">${esc(detail)}</div></div>`).join("");
  }

  function verdictBar(verdicts) {
    const total = Object.values(verdicts || {}).reduce((a, b) => a + b, 0);
    if (!total) return `<div class="verdict-bar"></div><div class="verdict-legend muted">no verdicts yet</div>`;
    const present = ["hit", "drift", "eviction", "cold", "unknown"].filter((v) => verdicts[v]);
    const parts = present.map((v) =>
      `<span title="${v}: ${verdicts[v]}" style="width:${(100 * verdicts[v]) / total}%;background:${VERDICT_COLORS[v]}"></span>`);
    const legend = present.map((v) =>
      `<span><i style="background:${VERDICT_COLORS[v]}"></i>${v} ${verdicts[v]}</span>`);
    return `<div class="verdict-bar" role="img" aria-label="verdicts">${parts.join("")}</div>` +
      `<div class="verdict-legend">${legend.join("")}</div>`;
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
      t: ch.series.t, yMin: 0, yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`, yUnit: "cached ÷ prompt", xUnit: "time",
      series: lanes.map((l) => ({ name: l, color: colorOf(l), values: ch.series.lanes[l].hit_ratio })),
      emptyText: "no cache reports in this window yet",
    });
    Charts.line(document.getElementById("chart-ttft"), {
      t: ch.series.t, yMin: 0, yFormat: fmtS, yUnit: "TTFT", xUnit: "time",
      series: lanes.map((l) => ({ name: l, color: colorOf(l), values: ch.series.lanes[l].ttft_p50_s })),
      emptyText: "no streaming requests in this window yet",
    });
    const hist = ch.decode_histogram;
    Charts.histogram(document.getElementById("chart-decode"), {
      edges: hist.edges, unit: "tok/s", yUnit: "requests",
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
      format: fmtN, unit: "tokens",
      legend: [...used].map((l) => ({ name: l, color: colorOf(l) })),
      emptyText: "no tokens lost in this window: every prefix held",
    });
  }

  // Special tokens (DeepSeek's `<｜User｜>`, `<｜begin▁of▁sentence｜>`, ...) are drawn as labelled
  // markers in plain ASCII, so they read the same whatever fonts the reviewer's machine has (the
  // full-width bar and the ▁ are empty boxes in many server fonts). Newlines and tabs are shown too.
  const SPECIAL = /<｜([^｜<>]{1,48})｜>|<\|([A-Za-z_][^|<>]{0,46})\|>/g;
  function tokenize(s) {
    // Each special token becomes one private-use character, so a diff never splits it.
    const table = [];
    const out = (s || "").replace(SPECIAL, (m) => {
      let i = table.indexOf(m);
      if (i < 0) { i = table.length; table.push(m); }
      return String.fromCharCode(0xE000 + i);
    });
    return [out, table];
  }
  function visible(text, table) {
    let html = "";
    for (const ch of text) {
      const code = ch.charCodeAt(0);
      if (code >= 0xE000 && code < 0xE000 + table.length) {
        const tok = table[code - 0xE000];
        const name = tok.replace(/^<[｜|]|[｜|]>$/g, "").replace(/▁/g, " ");
        html += `<span class="tok" title="special token ${esc(tok)}">${esc(name)}</span>`;
      } else if (ch === "\n") {
        html += `<span class="ctl" title="newline">\\n</span>\n`;
      } else if (ch === "\t") {
        html += `<span class="ctl" title="tab">\\t</span>`;
      } else {
        html += esc(ch);
      }
    }
    return html;
  }
  function showText(s) { const [t, table] = tokenize(s); return visible(t, table); }

  // Mark where two snippets stop agreeing: after their common prefix, find the nearest point where
  // they agree again (a run of RESYNC characters) and mark only what lies between.
  const RESYNC = 12;
  function diffPair(a0, b0) {
    const [a1, ta] = tokenize(a0);
    // One table for both sides, so the same token maps to the same character.
    const table = ta.slice();
    const b1 = (b0 || "").replace(SPECIAL, (m) => {
      let i = table.indexOf(m);
      if (i < 0) { i = table.length; table.push(m); }
      return String.fromCharCode(0xE000 + i);
    });
    const a = a1, b = b1;
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
    const part = (x, n, cls) => visible(x.slice(0, p), table) +
      (n ? `<mark class="${cls}">${visible(x.slice(p, p + n), table)}</mark>` : "") + visible(x.slice(p + n), table);
    return [part(a, cut[0], "del"), part(b, cut[1], "ins")];
  }

  const SEV_ORDER = ["critical", "major", "minor", "info"];
  const GROUP_TITLES = {
    actionable: ["Actionable", "the client or the lane's configuration can fix these; critical and major ones page"],
    unavoidable: ["Unavoidable by design", "the template or the conversation's own course does it; never paging"],
    repin: ["Deliberate re-pins", "the client asked for a new effort with X-Gateway-Repin; never paging"],
  };
  const FIX_TEXT = { client: "fix: client", lane: "fix: lane config", nobody: "nobody: by design" };

  function convLink(cid, label) {
    if (!cid) return "–";
    return `<a class="conv mono" href="#${esc(hashWith({ conversation: cid }))}" title="${esc(cid)}">${esc(label || cid)}</a>`;
  }

  function alertCard(a) {
    const [before, after] = diffPair(a.snippet_before, a.snippet_after);
    const where = [a.message_index !== null && a.message_index !== undefined ? `message ${a.message_index}` : null,
      a.field ? `field ${esc(a.field)}` : null, a.turn ? `turn ${a.turn}` : null].filter(Boolean).join(" · ");
    const count = a.count > 1 ? `<span class="badge" title="${a.per_hour}/hour">×${a.count}</span>` : "";
    const state = a.state ? `<span class="badge state">${esc(a.state)}${a.rule && a.rule.until ? ` until ${esc(fmtTime(a.rule.until))}` : ""}</span>` : "";
    const pages = a.pages ? `<span class="badge page" title="counts toward paging">pages</span>` : "";
    const effort = a.group === "repin" ? `· <span class="badge repin">re-pinned to effort ${esc(a.effort_applied ?? "?")}</span>` : "";
    const ack = a.state ? "" : `<button type="button" class="act" data-kind="ack" data-lane="${esc(a.lane || "*")}" data-cause="${esc(a.cause)}" data-client="${esc(a.client || "*")}" title="acknowledge this lane, cause and client for a day: stops paging for what happened so far">Ack 1 d</button>`;
    const mute = a.state === "muted" ? "" : `<button type="button" class="act" data-kind="mute" data-lane="${esc(a.lane || "*")}" data-cause="${esc(a.cause)}" data-client="${esc(a.client || "*")}" title="hide and never page this lane, cause and client for a week">Mute 7 d</button>`;
    return `<div class="alert sev-${esc(a.severity)} ${esc(a.group)}${a.state ? " triaged" : ""}" data-cause="${esc(a.cause)}">
      <div class="alert-head">
        <span class="badge sev ${esc(a.severity)}" title="${esc(a.severity_reason || "")}">${esc(a.severity)}</span>
        <span class="badge cause">${esc(String(a.cause || "unknown").replace(/_/g, " "))}</span>${count}${pages}${state}
        <span class="badge fix fix-${esc(a.fixable_by)}">${esc(FIX_TEXT[a.fixable_by] || a.fixable_by)}</span>
        <b>${esc(a.lane || "")}</b><span class="where">${where}</span>
        <span class="lost">${fmtN(a.tokens_lost_total)} tokens · ${fmtS(a.seconds_lost_total)} lost</span>
      </div>
      <div class="alert-meta">client <b>${esc(a.client || "unknown")}</b> · tenant ${esc(a.tenant || "default")}
        · conversation ${convLink(a.conversation)} · ${typeof a.time === "number" ? ago(a.time) : ""}${a.gateway ? ` · via ${esc(a.gateway)}` : ""} ${effort}</div>
      <div class="remedy"><b>What to do:</b> ${esc(a.remedy || "")}</div>
      <div class="snips"><div class="snip"><span class="cap">previous turn</span>${before || '<span class="muted">(empty)</span>'}</div>
        <div class="snip"><span class="cap">this turn</span>${after || '<span class="muted">(empty)</span>'}</div></div>
      <div class="alert-actions">${ack}${mute}</div></div>`;
  }

  function renderDrift(drift) {
    const box = document.getElementById("drift");
    const hint = document.getElementById("drift-hint");
    const summary = document.getElementById("drift-summary");
    if (drift === null || drift.error) {
      hint.textContent = "";
      summary.innerHTML = "";
      box.innerHTML = `<div class="none">drift alerts are not available: ${esc(drift ? drift.error : "no records")}</div>`;
      return;
    }
    const alerts = drift.alerts || [];
    const c = drift.counts || {};
    const scope = drift.source && drift.source.scope === "fleet" ? "every gateway of the fleet" : "this host";
    hint.textContent = `${scope} · ${c.paging || 0} paging`;
    summary.innerHTML = SEV_ORDER.map((s) => `<span class="badge sev ${s}">${c[s] || 0} ${s}</span>`).join("") +
      `<span class="muted">${c.acknowledged || 0} acknowledged · ${c.muted || 0} muted (hidden)</span>`;
    const pats = (drift.patterns || []).filter((p) => p.group === "actionable").slice(0, 5);
    const patHtml = pats.length ? `<h3>Patterns <span class="hint">the same cause from the same client on a lane: what to forward, or mute</span></h3>
      <table class="patterns"><thead><tr><th>severity</th><th>lane</th><th>cause</th><th>client</th><th class="num">conv.</th>
      <th class="num">turns</th><th class="num">tokens</th><th class="num">prefill</th><th></th></tr></thead><tbody>${pats.map((p) =>
      `<tr><td><span class="badge sev ${esc(p.severity)}">${esc(p.severity)}</span></td><td class="wrap">${esc(p.lane || "–")}</td>
        <td class="wrap">${esc(String(p.cause).replace(/_/g, " "))}</td><td class="wrap">${esc(p.client)}</td><td class="num">${p.conversations}</td>
        <td class="num">${p.turns}</td><td class="num">${fmtN(p.tokens_lost)}</td><td class="num">${fmtS(p.seconds_lost)}</td>
        <td>${p.state ? `<span class="badge state">${esc(p.state)}</span>` : `<button type="button" class="act" data-kind="mute" data-lane="${esc(p.lane || "*")}" data-cause="${esc(p.cause)}" data-client="${esc(p.client)}">Mute 7 d</button>`}</td></tr>`).join("")}</tbody></table>` : "";
    if (!alerts.length) {
      box.innerHTML = `<div class="none">no drift alerts${filtersActive() ? " match these filters" : ": every conversation kept its prefix"}</div>`;
    } else {
      box.innerHTML = ["actionable", "unavoidable", "repin"].map((g) => {
        const items = alerts.filter((a) => a.group === g);
        if (!items.length) return "";
        const [title, why] = GROUP_TITLES[g];
        return `<div class="group group-${g}"><h3>${title} <span class="badge">${items.length}</span> <span class="hint">${why}</span></h3>
          ${items.map(alertCard).join("")}</div>`;
      }).join("");
      box.insertAdjacentHTML("afterbegin", patHtml);
    }
    const rules = drift.rules || [];
    document.getElementById("rules").innerHTML = rules.length ? `<h3>Acknowledged and muted</h3><table class="rules"><thead><tr>
      <th>kind</th><th>lane</th><th>cause</th><th>client</th><th>until</th><th>note</th><th></th></tr></thead><tbody>${rules.map((r) =>
      `<tr><td>${esc(r.kind)}</td><td>${esc(r.lane)}</td><td>${esc(r.cause)}</td><td>${esc(r.client)}</td>
        <td>${esc(new Date(r.until * 1000).toLocaleString())}</td><td class="wrap">${esc(r.note || "")}</td>
        <td><button type="button" class="unrule" data-id="${esc(r.id)}">remove</button></td></tr>`).join("")}</tbody></table>` : "";
  }

  async function triage(kind, lane, cause, client) {
    const body = { kind, lane, cause, client, expires_in_s: kind === "ack" ? 86400 : 7 * 86400 };
    const note = window.prompt(`${kind === "ack" ? "Acknowledge" : "Mute"} ${cause} on ${lane} for ${client}. Note (optional):`, "");
    if (note === null) return;
    if (note) body.note = note;
    await send("POST", "/admin/api/triage", body);
    refresh();
  }

  async function send(method, path, body) {
    const headers = { "Content-Type": "application/json" };
    if (key) headers.Authorization = `Bearer ${key}`;
    const resp = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
    if (!resp.ok) {
      let msg = `${resp.status}`;
      try { msg += ` ${(await resp.json()).error.message}`; } catch (e) { /* not JSON */ }
      const banner = document.getElementById("error-banner");
      banner.textContent = `${method} ${path}: ${msg}`;
      banner.hidden = false;
    }
  }

  // -- who is costing us prefill -----------------------------------------------------------------
  const CAUSE_COLORS = ["#ea580c", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#d97706", "#2563eb", "#94a3b8"];
  function renderCosts(costs) {
    const by = document.getElementById("cost-by").value;
    const rows = (costs[by] || []);
    const key = by === "by_cause" ? "cause" : by === "by_client" ? "client" : "tenant";
    const top = rows.slice(0, 7);
    const series = top.map((r, i) => ({ name: String(r[key]).replace(/_/g, " "), color: CAUSE_COLORS[i], values: r.series }));
    if (rows.length > 7) {
      const other = costs.t.map((_, i) => rows.slice(7).reduce((a, r) => a + (r.series[i] || 0), 0));
      series.push({ name: `${rows.length - 7} more`, color: CAUSE_COLORS[7], values: other });
    }
    Charts.columns(document.getElementById("chart-costs"), {
      t: costs.t, width_s: costs.width_s, series, format: fmtN, yUnit: "tokens lost", xUnit: "time",
      emptyText: "no prefill lost in this window",
    });
    const table = (title, list, k, link) => list.length ? `<h3>${title}</h3><table><thead><tr><th>${k}</th>
      <th class="num">tokens</th><th class="num">prefill</th><th class="num">turns</th><th>mostly</th></tr></thead><tbody>${list.slice(0, 5).map((r) =>
      `<tr><td class="wrap">${link ? link(r) : esc(r[k])}</td><td class="num">${fmtN(r.tokens)}</td><td class="num">${fmtS(r.seconds)}</td>
        <td class="num">${r.turns}</td><td class="wrap">${esc(String(r.top_cause || r.cause || "").replace(/_/g, " "))}</td></tr>`).join("")}</tbody></table>` : "";
    const total = costs.total || { tokens: 0, seconds: 0, turns: 0 };
    document.getElementById("offenders").innerHTML =
      `<div class="cost-total"><b>${fmtN(total.tokens)}</b> tokens · <b>${fmtS(total.seconds)}</b> of prefill lost over ${total.turns} turns</div>` +
      table("Top clients", costs.by_client || [], "client") + table("Top tenants", costs.by_tenant || [], "tenant") +
      table("Top conversations", costs.top_conversations || [], "conversation",
        (r) => `${convLink(r.conversation)} <span class="muted">${esc(r.client || "")}</span>`);
  }

  function effortText(r) {
    let effort = r.effort_applied === null || r.effort_applied === undefined ? "–" : esc(r.effort_applied);
    if (r.effort_requested !== null && r.effort_requested !== undefined && r.effort_requested !== r.effort_applied) {
      effort = `${esc(r.effort_requested)} → ${effort}`;
    }
    if (r.effort_action && !["first", "kept", "off"].includes(r.effort_action)) {
      effort += ` <span class="badge${r.effort_action === "repinned" ? " repin" : ""}">${esc(r.effort_action === "repinned" ? "re-pin" : r.effort_action)}</span>`;
    }
    return effort;
  }

  function renderRecords(records) {
    const box = document.getElementById("records");
    if (!records.length) { box.innerHTML = `<div class="none">no requests recorded${filtersActive() ? " match these filters" : " yet"}</div>`; return; }
    const rows = records.map((r) => {
      const statusCls = r.cancelled ? "status-4" : `status-${String(r.status || 0)[0]}`;
      const cached = r.cached_tokens === null ? `<span class="muted" title="not reported">n/r</span>` : fmtN(r.cached_tokens);
      const pred = r.predicted_cached_tokens === null ? "" : ` <span class="muted">/ ${fmtN(r.predicted_cached_tokens)}</span>`;
      let limits = [];
      try { limits = r.limits_fired ? JSON.parse(r.limits_fired) : []; } catch (e) { /* keep [] */ }
      const limitText = limits.length ? ` <span class="badge warn" title="limits that fired">${limits.map(esc).join(", ")}</span>` : "";
      let healed = {};
      try { healed = r.healed ? JSON.parse(r.healed) : {}; } catch (e) { /* keep {} */ }
      const healedN = Object.values(healed).reduce((a, b) => a + b, 0);
      let verdict = `<span class="badge ${esc(r.verdict)}">${esc(r.verdict)}</span>${r.cause ? ` <span class="muted">${esc(r.cause.replace(/_/g, " "))}</span>` : ""}`;
      if (healedN) {  // drift healing's repairs of this request (gateway/heal)
        verdict += ` <span class="badge hit" title="drift healing: ${esc(Object.entries(healed).map(([k, n]) => `${k} ×${n}`).join(", "))}; ${fmtN(r.healed_tokens || 0)} cached tokens kept">healed ${healedN}</span>`;
      }
      const kv = kvOf(r);
      if (kv && kv.displaced_by && kv.displaced_by.length) {  // KV-cache events: who pushed the prefix out
        const by = kv.displaced_by.map((d) => `${d.conversation || "unattributed"} (${fmtN(d.tokens)})`).join(", ");
        verdict += ` <span class="muted" title="${esc(kv.note || "")}">by ${esc(by)}</span>`;
      }
      const from = r.fallback_from ? ` <span class="muted" title="the model's lane is ${esc(r.fallback_from)}">from ${esc(r.fallback_from)}</span>` : "";
      return `<tr><td class="mono">${fmtTime(r.ts)}</td><td class="wrap" title="model ${esc(r.model || "–")}">${esc(r.lane || "–")}${from}</td>
        <td class="wrap opt" title="${esc(r.user_agent || "")}">${esc(r.client || "–")}</td>
        <td>${convLink(r.conversation)}</td>
        <td class="num">${r.turn ?? "–"}</td><td class="${statusCls}" title="${esc([r.error_code, r.upstream_error].filter(Boolean).join(": "))}">${r.cancelled ? "cancelled" : r.status}${limitText}${admissionText(r)}</td>
        <td class="wrap">${effortText(r)}</td>
        <td class="num">${fmtN(r.prompt_tokens)}</td><td class="num">${cached}${pred}</td><td class="wrap">${verdict}</td>
        <td class="num">${fmtS(r.ttft_s)}</td><td class="num">${fmtTps(r.decode_tps)}</td><td class="num opt">${fmtS(r.total_s)}</td></tr>`;
    }).join("");
    box.innerHTML = `<table class="records"><thead><tr><th>time</th><th>lane</th><th class="opt">client</th><th>conversation</th><th class="num">turn</th>
      <th>status</th><th>effort</th><th class="num">prompt</th><th class="num">cached / pred.</th><th>verdict</th><th class="num">TTFT</th>
      <th class="num">tok/s</th><th class="num opt">total</th></tr></thead><tbody>${rows}</tbody></table>`;
  }

  // -- one conversation: its turns as a timeline ----------------------------------------------
  async function renderConversation(cid) {
    const box = document.getElementById("conversation");
    const f = currentFilters();
    let conv;
    try {
      conv = await api(`/admin/api/conversations/${encodeURIComponent(cid)}${f.tenant ? `?tenant=${encodeURIComponent(f.tenant)}` : ""}`);
    } catch (err) {
      box.innerHTML = `<div class="panel-head"><h2>Conversation ${esc(cid)}</h2><a href="#${esc(hashWith({ conversation: null }))}">← back to the overview</a></div>
        <div class="none">${esc(err.message)}</div>`;
      document.body.dataset.loaded = "1";
      return;
    }
    const t = conv.totals;
    const maxPrompt = Math.max(1, ...conv.turns.map((x) => x.prompt_tokens || 0));
    const rows = conv.turns.map((r) => {
      const pct = (v) => `${Math.min(100, (100 * (v || 0)) / maxPrompt).toFixed(1)}%`;
      const bars = `<div class="cachebar" title="prompt ${fmtN(r.prompt_tokens)} · predicted cached ${fmtN(r.predicted_cached_tokens)} · reported cached ${r.cached_tokens === null ? "not reported" : fmtN(r.cached_tokens)}">
        <span class="prompt" style="width:${pct(r.prompt_tokens)}"></span><span class="pred" style="width:${pct(r.predicted_cached_tokens)}"></span>
        <span class="rep" style="width:${pct(r.cached_tokens)}"></span></div>`;
      const cause = r.cause ? `<span class="muted">${esc(r.cause.replace(/_/g, " "))}</span>` : "";
      let main = `<tr class="turn v-${esc(r.verdict)}"><td class="num">${r.turn ?? "–"}</td><td class="mono">${fmtTime(r.ts)}</td>
        <td class="wrap"><span class="badge ${esc(r.verdict)}">${esc(r.verdict)}</span> ${cause}</td>
        <td class="num">${fmtN(r.predicted_cached_tokens)}</td><td class="num">${r.cached_tokens === null ? '<span class="muted" title="not reported">n/r</span>' : fmtN(r.cached_tokens)}</td>
        <td class="num opt">${fmtN(r.prompt_tokens)}</td><td class="barcell">${bars}</td>
        <td class="num">${r.tokens_lost ? fmtN(r.tokens_lost) : "–"}</td>
        <td class="wrap">${effortText(r)}</td><td class="wrap mono small">${esc(r.replica || "–")}</td>
        <td class="num">${fmtS(r.ttft_s)}</td><td class="num">${fmtTps(r.decode_tps)}</td></tr>`;
      if (r.verdict === "drift" || r.verdict === "eviction") {
        const [before, after] = diffPair(r.diff_before, r.diff_after);
        const where = r.divergence_message_index !== null && r.divergence_message_index !== undefined ? `message ${r.divergence_message_index}` : "";
        main += `<tr class="detail"><td></td><td colspan="11" class="detail-cell"><div class="remedy"><b>${esc(where)}${r.divergence_field ? ` · ${esc(r.divergence_field)}` : ""}</b>
          <span class="badge fix fix-${esc(r.fixable_by || "")}">${esc(FIX_TEXT[r.fixable_by] || "")}</span> ${esc(r.remedy || "")}</div>
          ${r.verdict === "drift" ? `<div class="snips"><div class="snip"><span class="cap">previous turn</span>${before || '<span class="muted">(not kept)</span>'}</div>
          <div class="snip"><span class="cap">this turn</span>${after || '<span class="muted">(not kept)</span>'}</div></div>` : ""}</td></tr>`;
      }
      return main;
    }).join("");
    const st = conv.state ? ` · pinned effort ${esc(conv.state.pinned_effort ?? "–")}${conv.state.pinned_thinking === false ? " (thinking off)" : ""}` : "";
    box.innerHTML = `<div class="panel-head"><h2>Conversation <span class="mono">${esc(conv.conversation)}</span></h2>
        <a href="#${esc(hashWith({ conversation: null }))}">← back to the overview</a></div>
      <div class="conv-meta">${conv.looked_up_as ? `client key <b>${esc(conv.looked_up_as)}</b> · ` : ""}identified by ${esc(conv.source || "–")}
        · lane <b>${esc(conv.lane || "–")}</b> · client <b title="${esc(conv.user_agent || "")}">${esc(conv.client || "–")}</b> · tenant ${esc(conv.tenant)}${st}</div>
      <div class="kpis small">
        <div class="kpi"><div class="label">Turns</div><div class="value">${t.turns}</div><div class="detail">${fmtTime(conv.first_seen)} → ${fmtTime(conv.last_seen)}</div></div>
        <div class="kpi"><div class="label">Cached</div><div class="value">${fmtN(t.cached_tokens)}</div><div class="detail">of ${fmtN(t.prompt_tokens)} prompt tokens</div></div>
        <div class="kpi"><div class="label">Drifts</div><div class="value">${t.drifts}</div><div class="detail">${t.turns_with_loss} turns lost tokens</div></div>
        <div class="kpi"><div class="label">Lost</div><div class="value">${fmtN(t.tokens_lost)}</div><div class="detail">${fmtS(t.seconds_lost)} of prefill</div></div>
      </div>
      <div class="legend cache-legend"><span><i class="prompt"></i>prompt</span><span><i class="pred"></i>predicted cached</span><span><i class="rep"></i>reported cached</span></div>
      <div class="scroll"><table class="timeline"><thead><tr><th class="num">turn</th><th>time</th><th>verdict · cause</th><th class="num">predicted</th>
        <th class="num">reported</th><th class="num opt">prompt</th><th>cached of prompt</th><th class="num">lost</th><th>effort</th><th>replica</th>
        <th class="num">TTFT</th><th class="num">tok/s</th></tr></thead><tbody>${rows}</tbody></table></div>`;
    document.body.dataset.loaded = "1";
  }

  // -- filters (kept in the URL hash) -----------------------------------------------------------
  const FILTER_NAMES = ["lane", "tenant", "client", "user_agent", "cause", "severity"];
  function hashParams() { return new URLSearchParams(location.hash.replace(/^#/, "")); }
  function currentFilters() {
    const h = hashParams();
    const out = {};
    for (const n of FILTER_NAMES) if (h.get(n)) out[n] = h.get(n);
    return out;
  }
  function filtersActive() { return Object.keys(currentFilters()).length > 0; }
  function hashWith(changes) {
    const h = hashParams();
    for (const [k, v] of Object.entries(changes)) { if (v === null || v === undefined || v === "") h.delete(k); else h.set(k, v); }
    return h.toString();
  }
  function query(extra, names) {
    const f = currentFilters();
    const q = new URLSearchParams(extra);
    for (const n of names || FILTER_NAMES) if (f[n]) q.set(n, f[n]);
    return q.toString();
  }
  function syncForm() {
    const form = document.getElementById("filters");
    const f = currentFilters();
    for (const n of FILTER_NAMES) { const input = form.elements[n]; if (input && document.activeElement !== input) input.value = f[n] || ""; }
  }
  function fillChoices(ov, drift) {
    const form = document.getElementById("filters");
    const set = (select, values) => {
      const cur = currentFilters()[select.name] || "";
      const all = [...new Set([...values, cur].filter(Boolean))].sort();
      const html = `<option value="">all</option>` + all.map((v) => `<option value="${esc(v)}">${esc(v.replace(/_/g, " "))}</option>`).join("");
      if (select.dataset.html !== html) { select.innerHTML = html; select.dataset.html = html; select.value = cur; }
    };
    set(form.elements.lane, ov.lanes.map((l) => l.name));
    set(form.elements.cause, [...CAUSES, ...((drift && drift.alerts) || []).map((a) => a.cause)]);
    const clients = new Set(((drift && drift.patterns) || []).map((p) => p.client));
    document.getElementById("clients").innerHTML = [...clients].map((c) => `<option value="${esc(c)}">`).join("");
  }
  const CAUSES = ["effort_changed", "thinking_toggled", "reasoning_dropped_by_template", "client_stripped_reasoning",
    "system_prompt_changed", "tools_changed", "response_format_changed", "history_edited", "image_removed",
    "tool_results_reordered", "regenerated", "unknown"];

  // -- refresh loop ---------------------------------------------------------------------------
  async function refresh() {
    const w = windowS();
    const buckets = w <= 900 ? 30 : 60;
    const banner = document.getElementById("error-banner");
    syncForm();
    const cid = hashParams().get("conversation");
    document.getElementById("conversation-view").hidden = !cid;
    document.getElementById("overview").hidden = !!cid;
    if (cid) {
      await renderConversation(cid);
      return;
    }
    const recordNames = ["lane", "tenant", "client", "user_agent", "cause"];
    try {
      const [ov, ch, rec, drift, kv, rl] = await Promise.all([
        api("/admin/api/overview"),
        api(`/admin/api/charts?${query({ window_s: w, buckets }, ["lane", "tenant", "client", "user_agent"])}`),
        api(`/admin/api/records?${query({ limit: 50 }, recordNames)}`),
        api(`/admin/api/alerts?${query({ window_s: w, since: -w, limit: 60 })}`).catch((err) => ({ error: err.message })),
        api("/admin/api/kv").catch(() => null),
        api("/admin/api/ratelimits").catch(() => null),
      ]);
      last = { ov, ch, rec, drift, kv, rl };
      draw();
      banner.hidden = !ch.rows_capped;
      if (ch.rows_capped) banner.textContent = "This window holds more records than one summary reads: the figures cover the newest 200,000. Narrow the window or filter.";
      document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.loaded = "1";
    } catch (err) {
      banner.textContent = `Could not refresh: ${err.message}`;
      banner.hidden = false;
    }
  }

  function draw() {
    if (!last) return;
    const { ov, ch, rec, drift, kv, rl } = last;
    [...ov.lanes.map((l) => l.name)].sort().forEach(colorOf);
    renderHeader(ov);
    fillChoices(ov, drift);
    renderKpis(ch.stats, drift && !drift.error ? drift : null);
    renderLanes(ov, ch.stats);
    renderCharts(ch);
    renderDrift(drift);
    renderCosts(ch.costs);
    renderKv(kv);
    renderRateLimits(rl);
    renderRecords(rec.records);
  }

  function jsonOf(value) {  // a record's JSON column (a string), or null
    if (!value) return null;
    try { return typeof value === "string" ? JSON.parse(value) : value; } catch (e) { return null; }
  }

  function kvOf(r) { return jsonOf(r.kv); }

  // What the fleet steps decided before the request was forwarded: cache-protecting admission (held,
  // refused, diverted to another lane) and per-tenant rate limits. A plain admission says nothing.
  function admissionText(r) {
    const a = jsonOf(r.admission);
    let out = "";
    if (a && a.decision !== "admitted") {
      const text = a.decision === "diverted" ? `diverted → ${a.diverted_to}`
        : `${a.decision.replace(/_/g, " ")}${a.waited_s ? ` ${fmtS(a.waited_s)}` : ""}`;
      out += ` <span class="badge warn admission" title="cache admission on ${esc(a.lane || r.lane || "")}: ${esc(a.reason || "")}">${esc(text)}</span>`;
    }
    if (r.rate_limited) out += ` <span class="badge warn" title="refused by a per-tenant rate limit">${esc(r.rate_limited)}</span>`;
    return out;
  }

  // KV-cache events: per replica, the KV-event stream, pool, working set, forecast and the pressure alert.
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

  // Per-tenant rate limits: each rule's use over the last minute against its limit.
  function renderRateLimits(rl) {
    const panel = document.getElementById("rl-panel");
    if (!rl || !rl.rules || !rl.rules.length) { panel.hidden = true; return; }
    panel.hidden = false;
    const use = (x) => x ? `${fmtN(Math.round(x.used))} / ${fmtN(x.limit)}` : "–";
    const rows = rl.rules.map((r) => `<tr><td>${esc(r.tenant)}</td><td>${esc(r.model || "all")}</td>
      <td class="num">${use(r.requests_per_minute)}</td><td class="num">${use(r.tokens_per_minute)}</td>
      <td class="num">${use(r.concurrent)}</td><td class="num">${fmtN(r.refused)}</td></tr>`).join("");
    document.getElementById("rl").innerHTML = `<table><thead><tr><th>tenant</th><th>model</th>
      <th class="num">requests / min</th><th class="num">tokens / min</th><th class="num">concurrent</th>
      <th class="num">refused</th></tr></thead><tbody>${rows}</tbody></table>`;
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
  const form = document.getElementById("filters");
  const apply = () => {
    const changes = {};
    for (const n of FILTER_NAMES) changes[n] = (form.elements[n].value || "").trim();
    location.hash = hashWith(changes);
  };
  form.addEventListener("change", (e) => { if (e.target.id !== "find-key") apply(); });
  form.addEventListener("keydown", (e) => { if (e.key === "Enter" && e.target.id !== "find-key" && e.target.tagName === "INPUT") { e.preventDefault(); apply(); } });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const k = document.getElementById("find-key").value.trim();
    if (k) location.hash = hashWith({ conversation: k });
  });
  document.getElementById("clear-filters").addEventListener("click", () => {
    const changes = {};
    for (const n of FILTER_NAMES) changes[n] = null;
    location.hash = hashWith(changes);
  });
  document.getElementById("cost-by").addEventListener("change", draw);
  document.addEventListener("click", (e) => {
    const b = e.target.closest("button.act");
    if (b) triage(b.dataset.kind, b.dataset.lane, b.dataset.cause, b.dataset.client);
    const u = e.target.closest("button.unrule");
    if (u) send("DELETE", `/admin/api/triage/${encodeURIComponent(u.dataset.id)}`).then(refresh);
  });
  window.addEventListener("hashchange", () => { window.scrollTo(0, 0); refresh(); });
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(draw, 150); });
  refresh().then(schedule);
})();
