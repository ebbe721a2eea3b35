// A very small SVG chart kit for the admin page: line over time, grouped histogram, stacked bars.
// No dependencies and no build step; every chart redraws from scratch on each refresh.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const H = 240;
  const PAD = { l: 56, r: 16, t: 22, b: 30 };

  function el(name, attrs, parent) {
    const n = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
    if (parent) parent.appendChild(n);
    return n;
  }

  function text(parent, x, y, s, attrs) {
    const t = el("text", Object.assign({ x, y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }

  // Round tick values from at or below `lo` to at or above `hi` in about `n` steps: the top gridline
  // is never below the tallest value.
  function ticks(lo, hi, n) {
    if (!(hi > lo)) hi = lo + 1;
    const raw = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const out = [];
    let v = Math.floor(lo / step + 1e-9) * step;
    for (; v < hi - step * 1e-9; v += step) out.push(+v.toFixed(10));
    out.push(+v.toFixed(10));
    return out;
  }

  // 1234 -> "1.2K", 800000 -> "800K", 2.5e6 -> "2.5M": axis labels stay short enough to fit.
  function compact(v) {
    const a = Math.abs(v);
    const trim = (x) => String(+x.toFixed(a >= 1e7 || (a >= 1e4 && a < 1e6) ? 0 : 1));
    if (a >= 1e6) return `${trim(v / 1e6)}M`;
    if (a >= 1e4) return `${trim(v / 1e3)}K`;
    if (a >= 100 || Number.isInteger(v)) return String(Math.round(v));
    return String(+v.toFixed(2));
  }

  // Keep every text inside the drawing: measured after layout, nudged in from the edges.
  function fitTexts(svg, w, h) {
    for (const t of svg.querySelectorAll("text")) {
      let b;
      try { b = t.getBBox(); } catch (e) { continue; }
      let dx = 0;
      if (b.x < 1) dx = 1 - b.x;
      else if (b.x + b.width > w - 1) dx = w - 1 - (b.x + b.width);
      if (dx) t.setAttribute("x", Number(t.getAttribute("x")) + dx);
      if (b.y < 0) t.setAttribute("y", Number(t.getAttribute("y")) - b.y);
      else if (h && b.y + b.height > h) t.setAttribute("y", Number(t.getAttribute("y")) - (b.y + b.height - h));
    }
  }

  // Units: the y axis's above its labels, the x axis's at the right end of its labels' row.
  function units(g, f, yUnit, xUnit) {
    if (yUnit) text(g, 4, 12, yUnit, { class: "unit", "text-anchor": "start" });
    if (xUnit) text(g, f.w - 2, H - 1, xUnit, { class: "unit", "text-anchor": "end" });
  }

  function frame(container) {
    container.innerHTML = "";
    const w = Math.max(320, container.clientWidth || 600);
    const svg = el("svg", { viewBox: `0 0 ${w} ${H}`, preserveAspectRatio: "none", role: "img" }, container);
    return { svg, w, iw: w - PAD.l - PAD.r, ih: H - PAD.t - PAD.b };
  }

  function empty(container, message) {
    container.innerHTML = `<div class="empty">${message || "no data in this window yet"}</div>`;
  }

  function legend(container, items) {
    const div = document.createElement("div");
    div.className = "legend";
    for (const it of items) {
      const span = document.createElement("span");
      const i = document.createElement("i");
      i.style.background = it.color;
      span.appendChild(i);
      span.appendChild(document.createTextNode(it.name));
      div.appendChild(span);
    }
    container.appendChild(div);
  }

  function yAxis(g, f, yt, y, fmt) {
    for (const v of yt) {
      el("line", { x1: PAD.l, x2: PAD.l + f.iw, y1: y(v), y2: y(v), class: "grid" }, g);
      text(g, PAD.l - 6, y(v) + 4, fmt(v), { "text-anchor": "end" });
    }
    el("line", { x1: PAD.l, x2: PAD.l + f.iw, y1: PAD.t + f.ih, y2: PAD.t + f.ih, class: "axis" }, g);
  }

  const tip = () => document.getElementById("tooltip");
  function showTip(evt, html) {
    const t = tip();
    if (!t) return;
    t.innerHTML = html;
    t.hidden = false;
    const x = Math.min(evt.clientX + 14, window.innerWidth - t.offsetWidth - 8);
    t.style.left = `${x}px`;
    t.style.top = `${evt.clientY + 14}px`;
  }
  function hideTip() { const t = tip(); if (t) t.hidden = true; }

  // Lines over time. opts: {t: [epoch s], series: [{name, color, values}], yMin, yMax, yFormat}
  function line(container, opts) {
    const series = opts.series.filter((s) => s.values.some((v) => v !== null && v !== undefined));
    if (!series.length) return empty(container, opts.emptyText);
    const f = frame(container);
    const g = f.svg;
    const all = series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
    const yMin = opts.yMin !== undefined ? opts.yMin : Math.min(0, ...all);
    let yMax = opts.yMax !== undefined ? opts.yMax : Math.max(...all) * 1.1;
    if (!(yMax > yMin)) yMax = yMin + 1;
    const yt = ticks(yMin, yMax, 4);
    const top = Math.max(yMax, yt[yt.length - 1]);
    const n = opts.t.length;
    const step = opts.t.length > 1 ? opts.t[1] - opts.t[0] : 60;
    const x = (i) => PAD.l + (n <= 1 ? f.iw / 2 : (i + 0.5) * (f.iw / n));
    const y = (v) => PAD.t + f.ih - ((v - yMin) / (top - yMin)) * f.ih;
    const fmt = opts.yFormat || ((v) => String(v));
    yAxis(g, f, yt, y, fmt);
    const every = Math.max(1, Math.ceil(n / Math.max(2, Math.floor(f.iw / 100))));
    for (let i = 0; i < n; i += every) {
      const d = new Date((opts.t[i] + step / 2) * 1000);
      const label = step >= 3600 ? d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", hourCycle: "h23" })
        : step < 30 ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" })
          : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
      text(g, x(i), H - 12, label, { "text-anchor": "middle" });
    }
    for (const s of series) {
      let d = "";
      let prev = false;
      s.values.forEach((v, i) => {
        if (v === null || v === undefined) { prev = false; return; }
        d += `${prev ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
        prev = true;
      });
      el("path", { d, fill: "none", stroke: s.color, "stroke-width": 2, "stroke-linejoin": "round" }, g);
      s.values.forEach((v, i) => {
        if (v !== null && v !== undefined) el("circle", { cx: x(i), cy: y(v), r: 2.6, fill: s.color }, g);
      });
    }
    // Hover: a crosshair and every series' value in that bucket.
    const cross = el("line", { y1: PAD.t, y2: PAD.t + f.ih, stroke: "#94a3b8", "stroke-dasharray": "3 3", visibility: "hidden" }, g);
    const hit = el("rect", { x: PAD.l, y: PAD.t, width: f.iw, height: f.ih, fill: "transparent" }, g);
    hit.addEventListener("mousemove", (evt) => {
      const box = g.getBoundingClientRect();
      const px = ((evt.clientX - box.left) / box.width) * f.w;
      const i = Math.max(0, Math.min(n - 1, Math.floor(((px - PAD.l) / f.iw) * n)));
      cross.setAttribute("x1", x(i)); cross.setAttribute("x2", x(i)); cross.setAttribute("visibility", "visible");
      const when = new Date(opts.t[i] * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: step < 60 ? "2-digit" : undefined, hourCycle: "h23" });
      const rows = series.map((s) => {
        const v = s.values[i];
        return `<div><span style="color:${s.color}">●</span> ${esc(s.name)}: <b>${v === null || v === undefined ? "–" : fmt(v)}</b></div>`;
      });
      showTip(evt, `<div>${when}</div>${rows.join("")}`);
    });
    hit.addEventListener("mouseleave", () => { cross.setAttribute("visibility", "hidden"); hideTip(); });
    units(g, f, opts.yUnit, opts.xUnit);
    fitTexts(g, f.w, H);
    legend(container, series);
  }

  // Grouped histogram. opts: {edges: [n+1], series: [{name, color, values: [n]}], xFormat, unit, yUnit}
  function histogram(container, opts) {
    const series = opts.series.filter((s) => s.values.some((v) => v > 0));
    if (!series.length || opts.edges.length < 2) return empty(container, opts.emptyText);
    const f = frame(container);
    const g = f.svg;
    const n = opts.edges.length - 1;
    const max = Math.max(...series.flatMap((s) => s.values));
    const yt = ticks(0, Math.max(max, 1), Math.min(4, Math.max(1, max)));
    const top = yt[yt.length - 1] || 1;
    const y = (v) => PAD.t + f.ih - (v / top) * f.ih;
    yAxis(g, f, yt, y, (v) => compact(v));
    const bw = f.iw / n;
    const inner = Math.max(1, (bw - 4) / series.length);
    const xf = opts.xFormat || compact;
    const every = Math.max(1, Math.ceil((n + 1) / Math.max(2, Math.floor(f.iw / 64))));
    for (let i = 0; i <= n; i += every) {
      // The outermost labels are anchored inwards so that neither is cut at the chart's edge.
      const anchor = i === 0 ? "start" : i === n ? "end" : "middle";
      text(g, PAD.l + i * bw, H - 12, xf(opts.edges[i]), { "text-anchor": anchor });
    }
    series.forEach((s, k) => {
      s.values.forEach((v, i) => {
        if (!v) return;
        const r = el("rect", { x: PAD.l + i * bw + 2 + k * inner, y: y(v), width: Math.max(1, inner - 1),
          height: PAD.t + f.ih - y(v), fill: s.color, rx: 1.5 }, g);
        r.addEventListener("mousemove", (evt) => showTip(evt,
          `${esc(s.name)}<br>${xf(opts.edges[i])}–${xf(opts.edges[i + 1])} ${opts.unit || ""}: <b>${v}</b> requests`));
        r.addEventListener("mouseleave", hideTip);
      });
    });
    units(g, f, opts.yUnit || "requests", opts.unit);
    fitTexts(g, f.w, H);
    legend(container, series);
  }

  // Stacked columns over time. opts: {t: [epoch s], width_s, series: [{name, color, values}], format, yUnit}
  function columns(container, opts) {
    const series = opts.series.filter((s) => s.values.some((v) => v > 0));
    if (!series.length) return empty(container, opts.emptyText);
    const f = frame(container);
    const g = f.svg;
    const n = opts.t.length;
    const totals = opts.t.map((_, i) => series.reduce((a, s) => a + (s.values[i] || 0), 0));
    const yt = ticks(0, Math.max(...totals, 1), 4);
    const top = yt[yt.length - 1] || 1;
    const y = (v) => PAD.t + f.ih - (v / top) * f.ih;
    const fmt = opts.format || compact;
    yAxis(g, f, yt, y, fmt);
    const bw = f.iw / n;
    const every = Math.max(1, Math.ceil(n / Math.max(2, Math.floor(f.iw / 90))));
    const step = opts.width_s || (n > 1 ? opts.t[1] - opts.t[0] : 60);
    for (let i = 0; i < n; i += every) {
      const d = new Date((opts.t[i] + step / 2) * 1000);
      const label = step >= 3600 ? d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", hourCycle: "h23" })
        : step * every < 60 ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" })
          : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
      text(g, PAD.l + (i + 0.5) * bw, H - 12, label, { "text-anchor": "middle" });
    }
    for (let i = 0; i < n; i++) {
      let acc = 0;
      for (const s of series) {
        const v = s.values[i] || 0;
        if (!(v > 0)) continue;
        const r = el("rect", { x: PAD.l + i * bw + Math.min(2, bw * 0.1), y: y(acc + v), width: Math.max(1, bw - Math.min(4, bw * 0.2)),
          height: y(acc) - y(acc + v), fill: s.color }, g);
        r.addEventListener("mousemove", (evt) => showTip(evt, `${esc(s.name)}: <b>${fmt(v)}</b> ${opts.yUnit || ""}`));
        r.addEventListener("mouseleave", hideTip);
        acc += v;
      }
    }
    units(g, f, opts.yUnit, opts.xUnit);
    fitTexts(g, f.w, H);
    legend(container, series);
  }

  // Horizontal stacked bars. opts: {rows: [{label, note, parts: [{name, color, value}]}], format, legend, unit}
  function stacked(container, opts) {
    const rows = opts.rows.filter((r) => r.parts.some((p) => p.value > 0));
    if (!rows.length) return empty(container, opts.emptyText);
    container.innerHTML = "";
    const w = Math.max(320, container.clientWidth || 600);
    const rowH = 30;
    const h = Math.max(120, rows.length * rowH + 34);
    const svg = el("svg", { viewBox: `0 0 ${w} ${h}`, role: "img" }, container);
    svg.style.height = `${h}px`;
    const fmt = opts.format || compact;
    // Label and value columns as wide as their longest text (measured), labels cut with an
    // ellipsis only past 45% of the width: no cause name is clipped by the chart's edge.
    const measure = (s, style) => {
      const t = text(svg, 0, 0, s, { style });
      const wd = t.getComputedTextLength();
      t.remove();
      return wd;
    };
    const labelStyle = "fill:#1b2330;font-size:12px";
    const smallStyle = "fill:#1b2330;font-size:11px";
    const valueStyle = "fill:#334155;font-weight:600";
    const valueText = (r) => fmt(r.parts.reduce((a, p) => a + (p.value > 0 ? p.value : 0), 0)) + (r.note ? ` · ${r.note}` : "");
    const labelW = Math.min(w * 0.45, Math.max(60, ...rows.map((r) => measure(r.label, labelStyle))) + 14);
    const valueW = Math.max(...rows.map((r) => measure(valueText(r), valueStyle))) + 12;
    const bar = Math.max(40, w - labelW - valueW - 4);
    const max = Math.max(...rows.map((r) => r.parts.reduce((a, p) => a + p.value, 0)));
    rows.forEach((r, i) => {
      const y0 = 8 + i * rowH;
      // A label too long for its column goes on two lines (split at the word that balances them);
      // only a single word longer than the column is cut, with the whole label as its tooltip.
      const room = labelW - 12;
      let lines = [r.label];
      if (measure(r.label, labelStyle) > room) {
        const words = r.label.split(" ");
        let best = null;
        for (let k = 1; k < words.length; k++) {
          const a = words.slice(0, k).join(" "), b = words.slice(k).join(" ");
          const wmax = Math.max(measure(a, smallStyle), measure(b, smallStyle));
          if (!best || wmax < best[0]) best = [wmax, [a, b]];
        }
        lines = best ? best[1] : [r.label];
      }
      const cut = (s, st) => {
        if (measure(s, st) <= room) return s;
        while (s.length > 4 && measure(s + "…", st) > room) s = s.slice(0, -1);
        return s + "…";
      };
      if (lines.length === 1) {
        const lt = text(svg, labelW - 8, y0 + 15, cut(lines[0], labelStyle), { "text-anchor": "end", style: labelStyle });
        if (lt.textContent !== r.label) { const tt = el("title", {}, lt); tt.textContent = r.label; }
      } else {
        lines.forEach((ln, k) => {
          const lt = text(svg, labelW - 8, y0 + 9 + k * 12, cut(ln, smallStyle), { "text-anchor": "end", style: smallStyle });
          const tt = el("title", {}, lt); tt.textContent = r.label;
        });
      }
      let x0 = labelW;
      for (const p of r.parts) {
        if (!(p.value > 0)) continue;
        const bw = (p.value / max) * bar;
        const rect = el("rect", { x: x0, y: y0 + 3, width: Math.max(1, bw), height: rowH - 10, fill: p.color, rx: 2 }, svg);
        rect.addEventListener("mousemove", (evt) => showTip(evt, `${esc(r.label)} · ${esc(p.name)}: <b>${fmt(p.value)}</b>`));
        rect.addEventListener("mouseleave", hideTip);
        x0 += bw;
      }
      text(svg, x0 + 6, y0 + 15, valueText(r), { style: valueStyle });
    });
    // The value axis: 0 at the bars' start, the unit at its end.
    const axisY = 8 + rows.length * rowH + 4;
    el("line", { x1: labelW, x2: labelW + bar, y1: axisY, y2: axisY, class: "axis" }, svg);
    text(svg, labelW, axisY + 14, "0", { "text-anchor": "start" });
    text(svg, labelW + bar, axisY + 14, `${fmt(max)} ${opts.unit || ""}`.trim(), { "text-anchor": "end", class: "unit" });
    fitTexts(svg, w, h);
    if (opts.legend) legend(container, opts.legend);
  }

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  return { line, histogram, stacked, columns, compact, esc };
})();
