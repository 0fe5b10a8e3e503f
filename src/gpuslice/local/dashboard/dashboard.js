// gpuslice dashboard: polls the agent's /v1/history and /v1/status, draws SVG line plots. No libraries.
"use strict";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const SVGNS = "http://www.w3.org/2000/svg";
const W = 600, H = 200, PAD = { l: 62, r: 10, t: 10, b: 24 };

const UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 1024], ["B", 1]];
function human(bytes) {
  for (const [u, s] of UNITS.slice(0, 4)) if (Math.abs(bytes) >= s) return (bytes / s).toFixed(1) + " " + u;
  return Math.round(bytes) + " B";
}

// Axis ticks a person reads at a glance: 0 and at most 4 equal steps up to the data's top, each step a round
// number of one unit. Bytes step in binary units by 1, 2, 4, 5, 8, 10, … 256, 500, 512 (so 1 GiB splits into
// 256 MiB steps and 80 GiB into 20 GiB ones); percents by 1, 2, 2.5, 5 × 10^k. A zero (or empty) series
// still gets a real scale: 1 GiB for bytes. Returns {top, ticks: [values], labels: [text]}.
const BYTE_STEPS = [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 100, 128, 200, 250, 256, 500, 512];
const MAX_STEPS = 4;
function niceAxis(maxValue, kind) {
  const most = maxValue > 0 && isFinite(maxValue) ? maxValue : (kind === "bytes" ? 2 ** 30 : 100);
  let step = null;
  if (kind === "bytes") {
    for (const [, unit] of [...UNITS].reverse()) {
      for (const m of BYTE_STEPS) {
        if (Math.ceil(most / (m * unit) - 1e-9) <= MAX_STEPS) { step = m * unit; break; }
      }
      if (step !== null) break;
    }
    if (step === null) step = Math.ceil(most / MAX_STEPS / 2 ** 40) * 2 ** 40;  // beyond 2 PiB: whole TiB
  } else {
    const base = 10 ** Math.floor(Math.log10(most / MAX_STEPS));
    step = [1, 2, 2.5, 5, 10].map(m => m * base).find(s => Math.ceil(most / s - 1e-9) <= MAX_STEPS);
  }
  const n = Math.max(1, Math.ceil(most / step - 1e-9));
  const ticks = Array.from({ length: n + 1 }, (_, i) => i * step);
  const label = kind === "bytes" ? byteLabel : v => +v.toFixed(6) + "%";
  return { top: n * step, ticks, labels: ticks.map(label) };
}
// An exact tick value in the largest unit that divides it: 1024 MiB → "1 GiB", 768 MiB → "768 MiB".
function byteLabel(v) {
  if (v === 0) return "0";
  for (const [u, s] of UNITS) if (v >= s && v % s === 0) return v / s + " " + u;
  return human(v);
}
function age(s) {
  if (s < 60) return Math.round(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.round(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}
function el(name, attrs, parent) {
  const node = document.createElementNS(SVGNS, name);
  for (const k in attrs) node.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(node);
  return node;
}

// series: [{label, t: [...], v: [...]}]; yMax: the axis must reach at least this (null: the data's top);
// kind: "bytes" or "percent" (the axis's units and ticks, see niceAxis)
function plot(id, series, yMax, kind) {
  const svg = document.getElementById("plot-" + id);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const ts = series.flatMap(s => s.t);
  const vs = series.flatMap(s => s.v.filter(v => v !== null));
  const tMax = ts.length ? Math.max(...ts) : Date.now() / 1000;
  const tMin = Math.min(ts.length ? Math.min(...ts) : tMax - 60, tMax - 60);
  const axis = niceAxis(yMax || Math.max(0, ...vs), kind);
  const top = axis.top;
  const x = t => PAD.l + (t - tMin) / Math.max(1e-9, tMax - tMin) * (W - PAD.l - PAD.r);
  const y = v => H - PAD.b - v / top * (H - PAD.t - PAD.b);
  el("rect", { x: PAD.l, y: PAD.t, width: W - PAD.l - PAD.r, height: H - PAD.t - PAD.b, fill: "#fff", stroke: "#ccc" }, svg);
  axis.ticks.forEach((v, i) => {
    el("line", { x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v), stroke: "#eee" }, svg);
    const label = el("text", { x: PAD.l - 4, y: y(v) + 4, "text-anchor": "end", "font-size": 10, fill: "#666",
                               class: "tick" }, svg);
    label.textContent = axis.labels[i];
  });
  const span = el("text", { x: W - PAD.r, y: H - 6, "text-anchor": "end", "font-size": 10, fill: "#666" }, svg);
  span.textContent = "last " + age(tMax - tMin);
  const legend = document.getElementById("legend-" + id);
  legend.innerHTML = "";
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const pts = [];
    s.t.forEach((t, k) => { if (s.v[k] !== null) pts.push(x(t).toFixed(1) + "," + y(s.v[k]).toFixed(1)); });
    el("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 2.5,
                     "data-series": s.label, "data-points": pts.length, class: "series" }, svg);
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${color}"></i>`;
    item.appendChild(document.createTextNode(s.label));
    legend.appendChild(item);
  });
}

function render(history, status) {
  const slices = Object.entries(history.slices);
  const devices = Object.entries(history.devices);
  const sliceLabel = (k, s) => `${s.grant_id} (${s.owner}) GPU ${s.device_index}`;
  plot("slice-memory", slices.map(([k, s]) => ({ label: sliceLabel(k, s), t: s.t, v: s.memory })), null, "bytes");
  plot("slice-compute", slices.map(([k, s]) => ({ label: sliceLabel(k, s), t: s.t, v: s.compute })), 100, "percent");
  const names = Object.fromEntries(status.devices.map(d => [String(d.index), d]));
  const devTop = Math.max(0, ...status.devices.map(d => d.memory_total));
  plot("device-memory", devices.map(([k, d]) => ({ label: `GPU ${k} ${names[k] ? names[k].name : ""}`, t: d.t, v: d.memory })), devTop, "bytes");
  plot("device-compute", devices.map(([k, d]) => ({ label: `GPU ${k}`, t: d.t, v: d.compute })), 100, "percent");
  document.getElementById("node").textContent = status.node;
  document.getElementById("meta").firstChild.textContent =
    `${status.devices.length} device(s), ${status.slices.length} slice(s), ${status.waiters.length} waiting — updated ${new Date(status.time * 1000).toLocaleTimeString()} `;
  const body = document.querySelector("#grants tbody");
  body.innerHTML = "";
  for (const s of status.slices) {
    const row = document.createElement("tr");
    const achieved = s.compute_achieved === null ? "-" : s.compute_achieved.toFixed(0) + "%";
    const set = s.exclusive ? "whole device" : (s.compute_set ? s.compute_set + "%" : "unpaced");
    const cells = [s.grant_id, s.owner, `${s.device_index} ${s.device_uuid.slice(0, 12)}…`,
      `${human(s.memory_used)} / ${human(s.memory_limit)}`, `${achieved} / ${set}`, s.priority,
      s.pids.join(" ") || "-", age(s.age_seconds), s.command];
    cells.forEach((c, i) => {
      const td = document.createElement("td");
      td.textContent = c;
      if (i === 3 || i === 4 || i === 7) td.className = "num";
      row.appendChild(td);
    });
    body.appendChild(row);
  }
}

// The backstop's findings (slices over their limit in NVML's count, GPU processes of no slice) and whatever
// the node could not read; the section stays hidden while there is nothing to say.
function renderBackstop(status) {
  const report = status.backstop || {};
  const rows = [];
  const index = Object.fromEntries(status.devices.map(d => [d.uuid, d.index]));
  for (const o of report.overruns || []) {
    rows.push(["over limit", o.grant_id, index[o.device_uuid], human(o.used), human(o.limit),
      `${o.action} (${o.over_for.toFixed(0)} s over)`, o.pids.join(" ")]);
  }
  for (const p of report.unattributed || []) {
    rows.push(["no slice", String(p.pid), index[p.device_uuid], p.used === null ? "?" : human(p.used), "-", "reported",
      p.command || ""]);
  }
  const body = document.querySelector("#backstop-table tbody");
  body.innerHTML = "";
  for (const cells of rows) {
    const row = document.createElement("tr");
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c === undefined ? "?" : String(c);
      row.appendChild(td);
    }
    body.appendChild(row);
  }
  document.getElementById("problems").textContent = (status.errors || []).map(e => "problem: " + e).join("\n");
  // "block", not "": an empty inline style falls back to the stylesheet's display: none, and the section never showed
  document.getElementById("backstop").style.display = rows.length || (status.errors || []).length ? "block" : "none";
}

async function tick() {
  try {
    const [history, status] = await Promise.all(["v1/history", "v1/status"].map(u => fetch(u).then(r => r.json())));
    render(history, status);
    renderBackstop(status);
    document.getElementById("error").textContent = "";
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (err) {
    document.getElementById("error").textContent = "agent unreachable: " + err;
  }
}
tick();
setInterval(tick, 1000);
